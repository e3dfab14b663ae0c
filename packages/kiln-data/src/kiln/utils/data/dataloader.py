"""``torch.utils.data.dataloader``: the DataLoader and its helpers, from :mod:`kiln.data`."""

from kiln.data import DataLoader, WorkerInfo, default_collate, default_convert, get_worker_info

__all__ = ["DataLoader", "WorkerInfo", "default_collate", "default_convert", "get_worker_info"]
