# A character-level LSTM language model in the style of the classic PyTorch examples: Embedding, LSTM,
# Linear, CrossEntropyLoss, gradient clipping, and sampling with torch.multinomial.
import sys

import torch
import torch.nn as nn

text = "hello kiln, hello torch. " * 40
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)


class CharLM(nn.Module):
    def __init__(self, vocab, hidden=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.rnn = nn.LSTM(32, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, state=None):
        out, state = self.rnn(self.embed(x), state)
        return self.head(out), state


torch.manual_seed(0)
model = CharLM(len(chars))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()
seq = 24
losses = []
for step in range(120):
    i = torch.randint(0, len(data) - seq - 1, (16,))
    x = torch.stack([data[j : j + seq] for j in i.tolist()])
    y = torch.stack([data[j + 1 : j + seq + 1] for j in i.tolist()])
    logits, _ = model(x)
    loss = loss_fn(logits.reshape(-1, len(chars)), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.item())

with torch.no_grad():
    x = torch.tensor([[stoi["h"]]])
    state, out = None, "h"
    for _ in range(20):
        logits, state = model(x, state)
        probs = torch.softmax(logits[0, -1], dim=-1)
        x = torch.multinomial(probs, num_samples=1).unsqueeze(0)
        out += chars[x.item()]
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; sample {out!r}")
sys.exit(0 if losses[-1] < 0.5 * losses[0] else 1)
