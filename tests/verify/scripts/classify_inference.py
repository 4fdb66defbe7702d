"""Inference of a small image classifier (random weights, fixed batches): prints the top-5 classes of each image."""
import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(16 * 16, 100)

    def forward(self, images):
        return self.head(self.features(images).flatten(1))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Classifier().to(device).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for batch in range(3):
            images = torch.randn(8, 3, 16, 16, generator=generator).to(device)
            print(batch, model(images).topk(5).indices.tolist())


if __name__ == "__main__":
    main()
