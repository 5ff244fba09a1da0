"""Train ResNet-18 on (synthetic or real) Fashion-MNIST with DistributedDataParallel.

Launch it with torchrun, one process per GPU (or several CPU processes):

    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 \\
        -m dlperf.train_ddp --epochs 3 --out results.json

(Run it as a module, as above: run as a file, its folder would come first on sys.path and
dlperf's own profile.py would shadow the standard library's.)

torchrun starts the processes and gives each its RANK, LOCAL_RANK and
WORLD_SIZE (and where to meet: MASTER_ADDR, MASTER_PORT) in the environment.
Each process trains on its own part of every epoch; DDP averages the
gradients with an allreduce during the backward pass, so every process takes
the same step. Rank 0 writes accuracy and time per epoch, and a checksum of
every rank's parameters, to the JSON file given by --out.

Sizes default to the run profile (DLPERF_PROFILE=quick or full, see dlperf);
every one can be set on the command line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

import dlperf
from dlperf.models import init_resnet, parameter_count, resnet18

# Sizes per run profile: small enough for two CPU processes on a laptop, or the real thing.
PROFILE_DEFAULTS = {
    "quick": dict(epochs=3, batch_size=64, lr=0.05, width=16, max_train=1536, max_test=500),
    "full": dict(epochs=10, batch_size=256, lr=0.1, width=64, max_train=None, max_test=None),
}


def parse_args(argv=None) -> argparse.Namespace:
    defaults = PROFILE_DEFAULTS[dlperf.run_profile().name]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=defaults["epochs"])
    parser.add_argument("--batch-size", type=int, default=defaults["batch_size"],
                        help="GLOBAL minibatch, split evenly over the processes")
    parser.add_argument("--lr", type=float, default=defaults["lr"])
    parser.add_argument("--width", type=int, default=defaults["width"],
                        help="channels of ResNet-18's first stage (64 in the original)")
    parser.add_argument("--max-train", type=int, default=defaults["max_train"])
    parser.add_argument("--max-test", type=int, default=defaults["max_test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: one GPU per process if there are GPUs, else the CPU")
    parser.add_argument("--out", required=True, help="JSON file for the results (rank 0 writes it)")
    return parser.parse_args(argv)


def setup(device_choice: str):
    """Join the process group torchrun prepared; NCCL for GPUs, gloo for CPUs."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = (torch.cuda.is_available() if device_choice == "auto"
                else device_choice == "cuda")
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        if os.path.exists("/sys/class/net/lo"):
            # stay on the loopback interface
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, timeout=timedelta(seconds=120),
                            device_id=device if use_cuda else None)
    return rank, world_size, device, backend


def test_shard(test_set, rank: int, world_size: int):
    """A contiguous 1/world_size of the test set, no padding, so the counts add up exactly."""
    indices = torch.arange(len(test_set)).tensor_split(world_size)[rank]
    return Subset(test_set, indices.tolist())


@torch.no_grad()
def evaluate(model, loader, device) -> float:
    """Test accuracy over all processes: each counts its shard, then the counts are summed."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for X, y in loader:
        X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
        counts[0] += (model(X).argmax(dim=1) == y).sum()  # stays on the device: no wait
        counts[1] += len(y)  # a Python number added in place: no copy to the device
    dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1])


def checksum(model) -> dict:
    """Sum and SHA-256 of all parameters and buffers: equal on all ranks iff they agree bit for bit."""
    digest, total = hashlib.sha256(), 0.0
    for tensor in list(model.parameters()) + list(model.buffers()):
        data = tensor.detach().cpu().contiguous()
        digest.update(data.numpy().tobytes())
        total += float(data.double().sum())
    return {"sum": total, "sha256": digest.hexdigest()}


def main(argv=None) -> None:
    args = parse_args(argv)
    rank, world_size, device, backend = setup(args.device)
    if args.batch_size % world_size:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by the "
                         f"{world_size} processes")
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # Share the cores out instead of every process using all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))

    # Rank 0 first: it may have to write the data files;
    # the others read them afterwards.
    if rank == 0:
        data = dlperf.fashion_mnist(verbose=True)
    dist.barrier()
    if rank != 0:
        data = dlperf.fashion_mnist(verbose=False)
    train_set, test_set = data.train, data.test
    if args.max_train is not None and args.max_train < len(train_set):
        train_set = Subset(train_set, range(args.max_train))
    if args.max_test is not None and args.max_test < len(test_set):
        test_set = Subset(test_set, range(args.max_test))
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                 shuffle=True,
                                 seed=args.seed)
    per_process_batch = args.batch_size // world_size
    # Batches in pinned (page-locked) host memory can be copied to a GPU
    # asynchronously; from ordinary memory, non_blocking=True below would
    # change nothing. No GPU, no pinning.
    pin = device.type == "cuda"
    # With a GPU, two worker processes decode and convert the images while the GPU
    # trains; without one, they would only take cores from the training processes.
    workers = 2 if device.type == "cuda" else 0
    train_loader = DataLoader(train_set, per_process_batch, sampler=sampler,
                              pin_memory=pin,
                              num_workers=workers, persistent_workers=workers > 0)
    test_loader = DataLoader(test_shard(test_set, rank, world_size), 256,
                             pin_memory=pin)

    # A fresh model, initialized explicitly and identically on every rank (same seed);
    # DDP would also copy rank 0's weights to the others when it wraps the model.
    model = init_resnet(resnet18(num_classes=10, in_channels=1, width=args.width),
                        seed=args.seed)
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None  # None: CPU
    ddp = DistributedDataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    if rank == 0:
        processes = f"{world_size} process" + ("es" if world_size > 1 else "")
        print(f"{processes}, backend {backend}, each on {dlperf.describe(device)};")
        print(f"ResNet-18 width {args.width} ({parameter_count(model):,} parameters); "
              f"global batch {args.batch_size} = {world_size} x {per_process_batch};")
        print(f"{len(train_set)} training / {len(test_set)} test images", flush=True)
    history = {"test_acc": [], "train_loss": [], "seconds": []}
    for epoch in range(args.epochs):
        # a different shuffle every epoch, the same on every rank
        sampler.set_epoch(epoch)
        dist.barrier()
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # on the device
        # on the host, which knows every batch's size without asking the device
        examples = 0
        for X, y in train_loader:
            X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(ddp(X), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP's hooks allreduce (average) the gradients here
            optimizer.step()
            # Sum the loss where it is; no .item() and no new tensor from the host, so
            # nothing in the step makes the host wait for the device.
            loss_sum += loss.detach() * len(y)
            examples += len(y)
        dlperf.synchronize(device)
        dist.barrier()
        seconds = time.perf_counter() - start
        # once per epoch
        totals = torch.stack([loss_sum, loss_sum.new_tensor(examples)])
        dist.all_reduce(totals)
        # Batch-norm running statistics are buffers, not parameters: each rank updated
        # its own in the last forward pass. DDP copies rank 0's buffers to the others at
        # the start of every forward; do the same before evaluating, so all ranks agree.
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
        # Evaluate the wrapped model itself: DDP's forward
        # would talk to the other ranks.
        accuracy = evaluate(model, test_loader, device)
        history["test_acc"].append(accuracy)
        history["train_loss"].append(float(totals[0] / totals[1]))
        history["seconds"].append(seconds)
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {history['train_loss'][-1]:.3f}, "
                  f"test accuracy {accuracy:.3f}, {seconds:.2f} s", flush=True)

    checksums = [None] * world_size
    dist.all_gather_object(checksums, checksum(model))
    if rank == 0:
        result = {
            "world_size": world_size, "backend": backend,
            "device": dlperf.describe(device),
            "data": data.describe(), "synthetic": data.synthetic,
            "parameters": parameter_count(model),
            "per_process_batch": per_process_batch,
            "args": vars(args), **history, "checksums": checksums,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    # Free DDP's reducer, and let every rank arrive, before destroying the
    # group: on PyTorch 2.11, destroying it under a live DDP model sometimes
    # aborted the processes at exit.
    del ddp, optimizer
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The results are written and the group is gone. Leave without the interpreter's
    # teardown, where PyTorch 2.11's gloo threads sometimes abort the process ("terminate
    # called without an active exception") after a run that went well.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
