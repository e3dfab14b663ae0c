# A small Transformer language model written as the word_language_model example writes its model (positional
# encoding, nn.TransformerEncoder with a square subsequent mask), trained to copy a repeating sequence, with
# the mixed-precision scaffolding such scripts carry (a GradScaler disabled off-GPU, CPU autocast).
import math
import sys

import torch
import torch.nn as nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp=32, nhead=2, nhid=64, nlayers=2, dropout=0.1):
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.ninp = ninp

    def forward(self, src):
        mask = nn.Transformer.generate_square_subsequent_mask(src.size(1))
        src = self.pos_encoder(self.encoder(src) * math.sqrt(self.ninp))
        return self.decoder(self.transformer_encoder(src, mask=mask, is_causal=True))


torch.manual_seed(0)
ntoken = 12
seq = (torch.arange(200) % 7 + 2) % ntoken
model = TransformerModel(ntoken)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
criterion = nn.CrossEntropyLoss()
losses = []
for step in range(60):
    starts = torch.randint(0, len(seq) - 17, (16,))
    batch = torch.stack([seq[s : s + 17] for s in starts.tolist()])
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=step % 2 == 1):
        output = model(batch[:, :-1])
        loss = criterion(output.reshape(-1, ntoken).float(), batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
sys.exit(0 if losses[-1] < 0.3 * losses[0] else 1)
