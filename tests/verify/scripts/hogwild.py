"""Hogwild training, as pytorch/examples' mnist_hogwild does it: one model in shared memory, trained by WORKERS
multiprocessing.Process workers (spawn) that update its parameters without locks, each on its own shuffle of the
data, normalised by a module without parameters first (torchvision's transforms.Normalize is a module, called
before the model); then the main process tests it (an inference pass)."""

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

WORKERS, EPOCHS = 2, 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(8, 32), torch.nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.out(torch.relu(self.hidden(x))), dim=1)


class Normalize(torch.nn.Module):
    """A transform that is a module, as torchvision's: the first outermost module each worker calls."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean()) / x.std()


def dataset(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(256, 8, generator=generator)
    return TensorDataset(inputs, (inputs[:, :3] * torch.tensor([1.0, 2.0, 3.0])).argmax(dim=1))


def train(rank: int, model: Net, data: TensorDataset) -> None:
    torch.manual_seed(1 + rank)  # each worker its own shuffle
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    for _ in range(EPOCHS):
        for inputs, targets in DataLoader(data, batch_size=16, shuffle=True):
            optimizer.zero_grad()
            torch.nn.functional.nll_loss(model(Normalize()(inputs)), targets).backward()
            optimizer.step()


if __name__ == "__main__":
    torch.manual_seed(1)
    mp.set_start_method("spawn", force=True)
    model = Net()
    model.share_memory()
    workers = [mp.Process(target=train, args=(rank, model, dataset(0))) for rank in range(WORKERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    model.eval()
    with torch.no_grad():
        test = dataset(1)
        correct = (model(test.tensors[0]).argmax(dim=1) == test.tensors[1]).sum().item()
    print(f"test accuracy {correct}/{len(test)}")
