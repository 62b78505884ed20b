"""ATen op -> TF op tables: `_table` holds the registry and its helpers,
one module per family of ops fills it (`_elementwise`, `_shape`, `_nn`,
`_conv`, `_rnn`)."""
