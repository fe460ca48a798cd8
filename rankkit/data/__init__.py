"""Data: file formats, the in-memory dataset, padding/bucketing, click simulation, bundled and synthetic data.

The LightningDataModule lives in :mod:`rankkit.training.datamodule`."""
from rankkit.data.bundled import load_mq2008
from rankkit.data.dataset import PaddedBatch, RankingDataset, concat, pad, padded_layout
from rankkit.data.fetch import fetch_letor_zip, fetch_mslr_web10k, fetch_mslr_web30k
from rankkit.data.svmlight import read_query_file, read_svmlight
from rankkit.data.synthetic import make_synthetic

__all__ = [
    "PaddedBatch", "RankingDataset", "concat", "fetch_letor_zip", "fetch_mslr_web10k", "fetch_mslr_web30k",
    "load_mq2008", "make_synthetic", "pad", "padded_layout", "read_query_file", "read_svmlight",
]
