# torch.func on a model: per-parameter gradients with grad + functional_call, and a Jacobian with jacrev.
import sys

import torch
from torch.func import functional_call, grad, jacrev

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
params = {k: v.detach() for k, v in model.named_parameters()}
x, y = torch.randn(16, 3), torch.randn(16, 1)


def loss(p, x, y):
    return torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y)


g = grad(loss)(params, x, y)
model.zero_grad()
loss({k: v for k, v in model.named_parameters()}, x, y).backward()
same = all(torch.allclose(g[k], p.grad, atol=1e-6) for k, p in model.named_parameters())
jac = jacrev(lambda inp: model(inp).sum(0))(x)
print(f"grads match backward: {same}; jacobian {tuple(jac.shape)}")
sys.exit(0 if same and tuple(jac.shape) == (1, 16, 3) else 1)
