# REINFORCE with torch.distributions.Categorical on a contextual bandit (as the reinforcement-learning
# example writes its policy), TensorBoard logging through torch.utils.tensorboard if it is installed.
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 32)
        self.affine2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=1)


torch.manual_seed(0)
policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=3e-2)
try:
    from torch.utils.tensorboard import SummaryWriter
except ModuleNotFoundError:  # tensorboard is optional
    SummaryWriter = None
logdir = tempfile.mkdtemp()
writer = SummaryWriter(logdir) if SummaryWriter else None
rewards = []
for episode in range(150):
    state = torch.eye(4)[torch.randint(0, 4, (32,))]
    m = Categorical(policy(state))
    action = m.sample()
    reward = (action == state.argmax(1)).float()
    loss = -(m.log_prob(action) * (reward - reward.mean())).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    rewards.append(reward.mean().item())
    if writer:
        writer.add_scalar("reward", rewards[-1], episode)
if writer:
    writer.close()
print(f"mean reward {sum(rewards[:10]) / 10:.2f} -> {sum(rewards[-10:]) / 10:.2f}")
sys.exit(0 if sum(rewards[-10:]) / 10 > 0.9 else 1)
