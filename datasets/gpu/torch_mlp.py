"""A small, unmodified-looking PyTorch MLP training loop, for `pagecast collect --managed torch`.

Plain PyTorch (nn.Linear, ReLU, cross-entropy, SGD with momentum): nothing in
it knows about managed memory; `--managed torch` switches its allocator.
Deterministic for a given --seed. `--scale S` multiplies the hidden width by
sqrt(S).

    pagecast collect --managed torch -- python -m pagecast.datasets.gpu.torch_mlp --scale 1
"""

from __future__ import annotations

from .common import parse_args


def main(argv=None) -> None:
    a = parse_args("torch_mlp", __doc__.splitlines()[0], argv)
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(a.seed)
    hidden = max(256, int(round(1024 * a.scale ** 0.5 / 128)) * 128)
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Linear(512, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    losses = []
    for step in range(8):
        bs = 128 if step % 4 else 96          # varying batch sizes
        x = torch.randn(bs, 512, generator=g).to(dev)
        y = torch.randint(0, 10, (bs,), generator=g).to(dev)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    torch.cuda.synchronize()
    print(f"torch_mlp: hidden {hidden}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
