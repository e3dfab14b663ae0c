# The MNIST CNN example's code (conv, dropout, log_softmax, nll_loss, Adadelta, StepLR, test loop), on a
# synthetic 10-class task (bright quadrant patterns) so that it needs no download.
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def make(n, generator):
    target = torch.randint(0, 10, (n,), generator=generator)
    data = 0.1 * torch.randn(n, 1, 16, 16, generator=generator)
    for i in range(n):
        k = int(target[i])
        data[i, 0, (k // 5) * 8 : (k // 5) * 8 + 8, (k % 5) * 3 : (k % 5) * 3 + 3] += 1.0
    return TensorDataset(data, target)


def train(model, device, loader, optimizer):
    model.train()
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


def test(model, device, loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    return test_loss / len(loader.dataset), correct / len(loader.dataset)


torch.manual_seed(1)
use_cuda = torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")
g = torch.Generator().manual_seed(0)
train_loader = DataLoader(make(512, g), batch_size=64, shuffle=True)
test_loader = DataLoader(make(256, g), batch_size=256)
model = Net().to(device)
optimizer = optim.Adadelta(model.parameters(), lr=1.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
for epoch in range(1, 4):
    train(model, device, train_loader, optimizer)
    loss, accuracy = test(model, device, test_loader)
    scheduler.step()
print(f"test loss {loss:.4f} accuracy {accuracy:.3f}")
sys.exit(0 if accuracy > 0.9 else 1)
