#!/usr/bin/env python3
"""Makes the committed PyTorch fixtures of tests/cli/imported.rs: a small model trained in
PyTorch, saved as a safetensors state_dict (one weight in bf16, one in fp16, batch norm's
num_batches_tracked as int64) and exported to ONNX by torch.onnx.export, with the rows and
the probabilities PyTorch gives them. The main suite then checks, without torch, that
`model.init_from` reads both files as PyTorch means them.

    target/interop-python/bin/python3 testing/torch_fixtures.py   # (testing/interop.sh installs torch there)

The outputs are deterministic for a given torch version (torch.manual_seed(0)); rerun it and
commit the files when the model changes.
"""
import json
import pathlib

import safetensors.torch
import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "cli" / "fixtures" / "torch"


class Net(torch.nn.Module):
    """ringflow's `sequential` [linear 8, batch_norm, relu, linear 3] in its names."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
            torch.nn.Linear(8, 3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def main():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(256, 4)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    opt = torch.optim.Adam(net.parameters(), 0.05)
    for i in range(0, 256, 16):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[i:i + 16]), y[i:i + 16]).backward()
        opt.step()
    net.eval()
    # The values the 16-bit tensors will hold, so that every file means the same model.
    with torch.no_grad():
        net.layers[0].weight.copy_(net.layers[0].weight.bfloat16().float())
        net.layers[3].weight.copy_(net.layers[3].weight.half().float())
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    state["layers.0.weight"] = state["layers.0.weight"].bfloat16()
    state["layers.3.weight"] = state["layers.3.weight"].half()
    OUT.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(state, OUT / "mlp.safetensors")
    rows = x[:16]
    torch.onnx.export(net, (rows,), OUT / "mlp.onnx", input_names=["features"],
                      output_names=["logits"], do_constant_folding=False, dynamo=False,
                      training=torch.onnx.TrainingMode.EVAL)
    with torch.no_grad():
        p = net(rows).softmax(-1)
    (OUT / "mlp.json").write_text(json.dumps({
        "torch": torch.__version__,
        "rows": rows.tolist(),
        "probabilities": p.tolist(),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
