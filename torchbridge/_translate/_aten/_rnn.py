"""Translations of ATen's recurrent layers (`lstm`, `gru`, `rnn_tanh`,
`rnn_relu`), unrolled over a fixed sequence length (see `_table`).

torch.export keeps `nn.LSTM` / `nn.GRU` / `nn.RNN` whole as one ATen op
holding every layer's and direction's weights. Unrolled, the graph is plain
matmuls and activations: XLA compiles it, TFLite converts it, and its
gradient is TF's own. The input projection of all steps is one matmul.
"""

import tensorflow as tf

from torchbridge._translate import _refusal
from torchbridge._translate._aten._table import translates

_NEEDS_LENGTH = (
  "a recurrent layer over a sequence of unknown length: give "
  "the time dimension a fixed size in input_signature"
)


def _lstm_cell(gates_x, h, c, w_hh, b_hh):
  gates = gates_x + tf.matmul(h, w_hh, transpose_b=True)
  if b_hh is not None:
    gates = gates + b_hh
  i, f, g, o = tf.split(gates, 4, axis=-1)
  c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
  return tf.sigmoid(o) * tf.tanh(c), c


def _gru_cell(gates_x, h, unused_c, w_hh, b_hh):
  gates_h = tf.matmul(h, w_hh, transpose_b=True)
  if b_hh is not None:
    gates_h = gates_h + b_hh
  r_x, z_x, n_x = tf.split(gates_x, 3, axis=-1)
  r_h, z_h, n_h = tf.split(gates_h, 3, axis=-1)
  r = tf.sigmoid(r_x + r_h)
  z = tf.sigmoid(z_x + z_h)
  n = tf.tanh(n_x + r * n_h)
  return (1 - z) * n + z * h, None


def _simple_cell(activation):
  def cell(gates_x, h, unused_c, w_hh, b_hh):
    pre = gates_x + tf.matmul(h, w_hh, transpose_b=True)
    return activation(pre if b_hh is None else pre + b_hh), None

  return cell


def _run_direction(cell, x_tf, h, c, weights, reverse):
  """One layer, one direction over batch-major `x_tf` (N, T, F)."""
  w_ih, w_hh = weights[0], weights[1]
  b_ih, b_hh = (weights[2], weights[3]) if len(weights) == 4 else (None, None)
  steps = x_tf.shape[1]
  if steps is None:
    raise _refusal.Refusal("op", _NEEDS_LENGTH)
  gates_x = tf.matmul(tf.reshape(x_tf, [-1, x_tf.shape[-1]]), w_ih, transpose_b=True)
  gates_x = tf.reshape(gates_x, [-1, steps, w_ih.shape[0]])
  if b_ih is not None:
    gates_x = gates_x + b_ih
  outputs = [None] * steps
  for t in reversed(range(steps)) if reverse else range(steps):
    h, c = cell(gates_x[:, t], h, c, w_hh, b_hh)
    outputs[t] = h
  return tf.stack(outputs, axis=1), h, c


def _recurrent(cell, has_cell_state):
  def translate_recurrent(
    out, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
  ):
    del dropout  # train is False (refused otherwise): no dropout
    if train:
      raise _refusal.Refusal("op", "a recurrent layer in training mode")
    h0, c0 = (hx[0], hx[1]) if has_cell_state else (hx, None)
    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != per * num_layers * directions:
      raise _refusal.Refusal("op", "an LSTM with proj_size")
    layer_in = x if batch_first else tf.transpose(x, [1, 0, 2])
    hs, cs = [], []
    for layer in range(num_layers):
      outputs = []
      for direction in range(directions):
        k = layer * directions + direction
        y, h, c = _run_direction(
          cell,
          layer_in,
          h0[k],
          None if c0 is None else c0[k],
          params[k * per : (k + 1) * per],
          direction == 1,
        )
        outputs.append(y)
        hs.append(h)
        cs.append(c)
      layer_in = outputs[0] if directions == 1 else tf.concat(outputs, -1)
    output = layer_in if batch_first else tf.transpose(layer_in, [1, 0, 2])
    if has_cell_state:
      return output, tf.stack(hs), tf.stack(cs)
    return output, tf.stack(hs)

  return translate_recurrent


translates("aten.lstm.input")(_recurrent(_lstm_cell, has_cell_state=True))
translates("aten.gru.input")(_recurrent(_gru_cell, has_cell_state=False))
translates("aten.rnn_tanh.input")(_recurrent(_simple_cell(tf.tanh), False))
translates("aten.rnn_relu.input")(_recurrent(_simple_cell(tf.nn.relu), False))
