"""MNIST from the shipped Parquet as the CNN peers take it (`benches/keras_cnn.py`,
`benches/jax_cnn.py`): float32 pixels / 255 in channels-last `[n, 28, 28, 1]` and int32 labels."""

import numpy as np
import pyarrow.parquet as pq


def load(path):
    """Images `[n, 28, 28, 1]` (float32 in [0, 1]) and labels `[n]` (int32) of one split."""
    table = pq.read_table(path, columns=["image", "label"])
    x = np.stack(table.column("image").to_numpy(zero_copy_only=False)).astype(np.float32) / 255.0
    return x.reshape(-1, 28, 28, 1), table.column("label").to_numpy().astype(np.int32)
