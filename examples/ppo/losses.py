"""The PPO loss over padded sequences, in TF and in torch, masked or not.

`masked=True` averages every term over the real steps only
(`tf.sequence_mask(seq_lens, T)`), advantages normalized over those steps.
`masked=False` is the bug RLlib's PPO once had: the same means taken over
the whole padded `[N, T]` batch, padding included (its zeros count in the
advantage statistics and the denominators). The torch function is the same
computation term for term, for the `--backend torch` twin and the tests.
"""

import tensorflow as tf
import torch

VALUE_COEF = 0.5
ENTROPY_COEF = 0.0


def ppo_loss_tf(logits, values, batch, clip_range, masked=True):
  """Returns (loss, stats) for one padded minibatch; TF tensors."""
  steps = tf.shape(values)[1]
  mask = (
    tf.sequence_mask(batch.seq_lens, steps, dtype=values.dtype) if masked else tf.ones_like(values)
  )
  count = tf.reduce_sum(mask)
  mean = lambda x: tf.reduce_sum(x * mask) / count  # noqa: E731
  adv = batch.advantages
  adv_mean = mean(adv)
  adv = (adv - adv_mean) / (tf.sqrt(mean(tf.square(adv - adv_mean))) + 1e-8)
  logp_all = tf.nn.log_softmax(logits)
  logp = tf.reduce_sum(
    logp_all * tf.one_hot(batch.actions, tf.shape(logits)[-1], dtype=logits.dtype), -1
  )
  ratio = tf.exp(logp - batch.old_logp)
  clipped = tf.clip_by_value(ratio, 1.0 - clip_range, 1.0 + clip_range)
  policy_loss = -mean(tf.minimum(ratio * adv, clipped * adv))
  value_loss = mean(tf.square(batch.returns - values))
  entropy = mean(-tf.reduce_sum(tf.exp(logp_all) * logp_all, -1))
  loss = policy_loss + VALUE_COEF * value_loss - ENTROPY_COEF * entropy
  stats = {
    "policy_loss": policy_loss,
    "value_loss": value_loss,
    "entropy": entropy,
    "approx_kl": mean((ratio - 1.0) - (logp - batch.old_logp)),
    "clip_fraction": mean(tf.cast(tf.abs(ratio - 1.0) > clip_range, values.dtype)),
  }
  return loss, stats


def ppo_loss_torch(logits, values, batch, clip_range, masked=True):
  """`ppo_loss_tf` in torch: the same terms, in the same order."""
  steps = values.shape[1]
  if masked:
    mask = (torch.arange(steps)[None, :] < batch.seq_lens[:, None]).to(values.dtype)
  else:
    mask = torch.ones_like(values)
  count = mask.sum()
  mean = lambda x: (x * mask).sum() / count  # noqa: E731
  adv = batch.advantages
  adv_mean = mean(adv)
  adv = (adv - adv_mean) / (torch.sqrt(mean(torch.square(adv - adv_mean))) + 1e-8)
  logp_all = torch.log_softmax(logits, -1)
  logp = logp_all.gather(-1, batch.actions[..., None]).squeeze(-1)
  ratio = torch.exp(logp - batch.old_logp)
  clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
  policy_loss = -mean(torch.minimum(ratio * adv, clipped * adv))
  value_loss = mean(torch.square(batch.returns - values))
  entropy = mean(-(torch.exp(logp_all) * logp_all).sum(-1))
  loss = policy_loss + VALUE_COEF * value_loss - ENTROPY_COEF * entropy
  stats = {
    "policy_loss": policy_loss,
    "value_loss": value_loss,
    "entropy": entropy,
    "approx_kl": mean((ratio - 1.0) - (logp - batch.old_logp)),
    "clip_fraction": mean((torch.abs(ratio - 1.0) > clip_range).to(values.dtype)),
  }
  return loss, stats
