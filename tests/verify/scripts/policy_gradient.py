"""REINFORCE on a fixed toy task (pytorch/examples' reinforcement_learning/reinforce.py in small): actions sampled
from a Categorical, whose log_prob's backward computes masks and quotients from forward values alone."""

import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
states = torch.randn(6, 8, 4)
for episode in range(100):
    log_probs, rewards = [], []
    for state in states[episode % 6]:
        distribution = Categorical(policy(state))
        action = distribution.sample()
        log_probs.append(distribution.log_prob(action))
        rewards.append(float(action.item() == int(state[0] > 0)))
    returns = torch.tensor(rewards).flip(0).cumsum(0).flip(0)
    returns = (returns - returns.mean()) / (returns.std() + 1e-6)
    loss = torch.stack([-log_prob * ret for log_prob, ret in zip(log_probs, returns)]).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
