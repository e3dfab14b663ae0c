# Polynomial regression, written as the classic PyTorch example: fit y = 0.5 x^3 - x + 2 with nn.Linear on
# polynomial features, a DataLoader, SGD and a saved/reloaded checkpoint.
import sys
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.backends.cudnn.benchmark = True
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

x = torch.linspace(-2, 2, 256).unsqueeze(1)
y = 0.5 * x**3 - x + 2 + 0.01 * torch.randn(x.size())
features = torch.cat([x**i for i in range(1, 4)], 1)
loader = DataLoader(TensorDataset(features, y), batch_size=32, shuffle=True)

model = nn.Linear(3, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.MSELoss()
first = None
for epoch in range(60):
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
    first = loss.item() if first is None else first

with tempfile.TemporaryDirectory() as tmp:
    torch.save(model.state_dict(), f"{tmp}/model.pt")
    clone = nn.Linear(3, 1)
    clone.load_state_dict(torch.load(f"{tmp}/model.pt", weights_only=True))
with torch.no_grad():
    final = criterion(clone(features), y).item()
print(f"first {first:.4f} final {final:.6f}")
sys.exit(0 if final < first and final < 1e-2 else 1)
