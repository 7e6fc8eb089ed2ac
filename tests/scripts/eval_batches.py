"""The evaluation data both Trainer scripts use: four identical 8-token sequences (enough to run eval)."""

import torch
from torch.utils.data import Dataset


class Batches(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        ids = torch.tensor([2, 5, 6, 7, 8, 9, 10, 11])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
