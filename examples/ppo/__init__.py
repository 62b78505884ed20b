"""PPO with a recurrent (LSTM) or feed-forward actor-critic, for ppo_lstm_cartpole.py."""
