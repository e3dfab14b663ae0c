# The VAE example's model and loss (reparameterisation with randn_like, binary cross-entropy summed, KL term),
# trained on synthetic binary images.
import sys

import torch
from torch import nn, optim
from torch.nn import functional as F


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


torch.manual_seed(0)
prototypes = (torch.rand(4, 64) > 0.5).float()
data = prototypes[torch.randint(0, 4, (256,))]
model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-2)
losses = []
for epoch in range(40):
    model.train()
    recon, mu, logvar = model(data)
    loss = loss_function(recon, data, mu, logvar) / len(data)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(f"loss {losses[0]:.2f} -> {losses[-1]:.2f}")
sys.exit(0 if losses[-1] < 0.6 * losses[0] else 1)
