"""A sequence model trained on the GPU that draws random numbers in every step the ways models do: the dropout an
nn.LSTM draws between its layers, a VAE's reparameterised sample (torch.randn_like), a stochastic-depth mask
(Tensor.bernoulli_), weight noise (Tensor.normal_) and tokens sampled from its own predictions (torch.multinomial).
tests/verify/test_verdicts.py verifies it against its port, random_draws_npu.py: every draw is aligned, so the
faithful pair passes."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM = 16, 12


class NoisySequenceModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.LSTM(DIM, DIM, num_layers=2, dropout=0.2, batch_first=True)
        self.mean, self.log_var = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        mean, log_var = self.mean(hidden), self.log_var(hidden)
        sample = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        kept = torch.empty(sample.shape[0], 1, 1, device=sample.device).bernoulli_(0.8)
        sample = sample * kept / 0.8 + torch.empty_like(sample).normal_(0.0, 0.01)
        kl = -0.5 * torch.mean(1 + log_var - mean.pow(2) - log_var.exp())
        return self.head(sample), kl


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    text = torch.randint(0, VOCAB, (48, 9))
    model = NoisySequenceModel().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        batch = text[(step * 8) % 48:(step * 8) % 48 + 8].to(device)
        optimizer.zero_grad()
        logits, kl = model(batch[:, :-1])
        logits = logits.reshape(-1, VOCAB)
        sampled = torch.multinomial(F.softmax(logits.detach(), dim=-1), 1).squeeze(1)
        loss = F.cross_entropy(logits, batch[:, 1:].reshape(-1)) + 0.1 * F.cross_entropy(logits, sampled) + 0.1 * kl
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
