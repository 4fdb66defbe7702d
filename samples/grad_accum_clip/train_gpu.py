"""Text classification with a bag-of-ngrams model, a large effective batch built by gradient accumulation.

The effective batch is --batch-size x --accum-steps; gradients are clipped to --max-grad-norm before each step.

    python train_gpu.py --batch-size 32 --accum-steps 8 --max-grad-norm 1.0
"""
import argparse
import math
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SyntheticReviews(Dataset):
    """Variable-length token sequences; the label is the sign of the summed per-token sentiment (hidden weights)."""

    def __init__(self, size, vocab, max_len, seed):
        rng = np.random.default_rng(seed)
        sentiment = rng.normal(size=vocab)
        lengths = rng.integers(8, max_len + 1, size=size)
        self.texts = [rng.integers(1, vocab, size=n) for n in lengths]  # 0 is the padding token
        self.labels = [int(sentiment[text].sum() > 0) for text in self.texts]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        return torch.from_numpy(self.texts[index]), self.labels[index]


def pad_batch(batch):
    texts, labels = zip(*batch)
    tokens = nn.utils.rnn.pad_sequence(texts, batch_first=True, padding_value=0)
    return tokens, torch.tensor(labels)


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean", padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, classes))

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def warmup_linear(warmup, total):
    """LambdaLR factor: linear warmup then linear decay to zero, per optimizer step."""
    return lambda step: min((step + 1) / warmup, max(0.0, (total - step) / max(1, total - warmup)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accum-steps", type=int, default=8)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--vocab", type=int, default=20_000)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)

    dataset = SyntheticReviews(args.samples, args.vocab, args.max_len, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, collate_fn=pad_batch, drop_last=True)

    model = BagOfEmbeddings(args.vocab, args.dim, 2).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    total_steps = args.epochs * math.ceil(len(loader) / args.accum_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(args.warmup_steps, total_steps))
    criterion = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for i, (tokens, labels) in enumerate(loader):
            tokens = tokens.to(args.device, non_blocking=True)
            labels = labels.to(args.device, non_blocking=True)
            loss = criterion(model(tokens), labels)
            # average, not sum, the gradients of the micro-batches
            (loss / args.accum_steps).backward()

            if (i + 1) % args.accum_steps == 0 or i + 1 == len(loader):
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} grad-norm {grad_norm.item():.3f} "
                      f"lr {scheduler.get_last_lr()[0]:.2e}")

    if args.device.startswith("cuda"):
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f}MiB")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
