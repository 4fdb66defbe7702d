"""A Hugging Face-shaped training: the batch is a dict the model takes as keyword arguments, `model(**batch)`, and
the model computes its own loss from `labels`, as transformers' models do."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        hidden = (self.embed(input_ids) * attention_mask.unsqueeze(-1)).sum(1) / attention_mask.sum(1, keepdim=True)
        logits = self.head(hidden)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
examples = [{"input_ids": torch.randint(0, 50, (6,)), "attention_mask": torch.ones(6, dtype=torch.long),
             "labels": torch.tensor(i % 3)} for i in range(64)]
loader = DataLoader(examples, batch_size=8, shuffle=False,
                    collate_fn=lambda rows: {key: torch.stack([row[key] for row in rows]) for key in rows[0]})
model = TinyClassifier().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for batch in loader:
    batch = {key: value.to(device) for key, value in batch.items()}
    loss = model(**batch)["loss"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"loss {loss.item():.4f}")
