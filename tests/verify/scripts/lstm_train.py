"""A character-level language model with an nn.LSTM, trained in fp32 on synthetic text (migrate adds fp16 autocast
and a GradScaler to its port)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharModel(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    text = torch.randint(0, 32, (64, 17))
    model = CharModel(32, 32).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        batch = text[(step * 8) % 64:(step * 8) % 64 + 8].to(device)
        optimizer.zero_grad()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
