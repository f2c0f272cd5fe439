"""The Keras peers' throughput callback (`benches/keras_cnn.py`, `benches/keras_ner.py`)."""

import time

import tensorflow as tf


class Rate(tf.keras.callbacks.Callback):
    """Records `count / seconds` of every epoch (`count`: the samples, or real tokens, it trains)."""

    def __init__(self, count):
        super().__init__()
        self.count = count
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.rates.append(self.count / (time.perf_counter() - self.start))
