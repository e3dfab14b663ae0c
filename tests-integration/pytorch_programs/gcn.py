# A two-layer graph convolutional network (Kipf & Welling) as the PyTorch GCN examples write it: a
# normalised sparse adjacency, torch.spmm, dropout, log_softmax and nll_loss on a planted-partition graph.
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x, adj):
        return torch.spmm(adj, torch.mm(x, self.weight)) + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        return F.log_softmax(self.gc2(x, adj), dim=1)


torch.manual_seed(0)
n, k = 120, 3
labels = torch.arange(n) % k
same = labels[:, None] == labels[None, :]
dense = (torch.rand(n, n) < torch.where(same, torch.tensor(0.2), torch.tensor(0.01))).float()
dense = ((dense + dense.t()) > 0).float() + torch.eye(n)
deg = dense.sum(1)
norm = dense / deg.sqrt()[:, None] / deg.sqrt()[None, :]
idx = norm.nonzero().t()
adj = torch.sparse_coo_tensor(idx, norm[idx[0], idx[1]], (n, n)).coalesce()
features = torch.randn(n, 16) + F.one_hot(labels, 16).float()
train_mask = torch.rand(n) < 0.3

model = GCN(16, 16, k, 0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
for epoch in range(100):
    model.train()
    optimizer.zero_grad()
    output = model(features, adj)
    loss = F.nll_loss(output[train_mask], labels[train_mask])
    loss.backward()
    optimizer.step()
model.eval()
accuracy = (model(features, adj).argmax(1) == labels)[~train_mask].float().mean().item()
print(f"loss {loss.item():.3f} test accuracy {accuracy:.3f}")
sys.exit(0 if accuracy > 0.8 else 1)
