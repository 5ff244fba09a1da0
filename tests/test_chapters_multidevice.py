"""Page tests of 13.5-13.7 (multiple devices, DDP, parameter servers), as the book build ran them."""
import pytest
import torch

from tests.helpers import figures, number

pytestmark = pytest.mark.integration

ON_GPU = torch.cuda.is_available()


def test_multiple_gpus_from_scratch(page_outputs):
    nb, text, values = page_outputs("chapters/multiple-gpus")
    if not ON_GPU:
        assert "No GPU found: using 2 CPU virtual devices" in text
        assert "ValueError: Expected a non cpu device" in text  # scatter refuses the CPU, shown
    else:
        assert "cuda:0" in text
    assert "SYNTHETIC" in text  # the tests always run on the synthetic set, and the page says so
    # split_batch's shard sizes are those of torch.chunk / scatter
    assert "10 examples over 4 devices -> shard sizes [3, 3, 3, 1]" in text
    assert " 6 examples over 4 devices -> shard sizes [2, 2, 2]" in text
    assert "after:  ['[[3.0, 3.0, 3.0]]" in text  # allreduce left the sum on both devices
    # one step on two devices equals one step on one device, up to rounding
    assert number(values, "step_difference") < 1e-4
    assert "largest difference between the two replicas: 0.0e+00" in text
    # the two runs' parameters after training are compared too, not only after one step
    assert "largest parameter difference, 1 device vs 2 devices, after " in text
    # both runs learned (chance is 0.1), kept learning after the first epoch, and were timed
    for k in (1, 2):
        assert number(values, f"acc_{k}") > 0.5
        assert number(values, f"acc_first_{k}") < min(0.99, number(values, f"acc_{k}"))
        assert number(values, f"sec_{k}") > 0
    assert text.count("epoch 1: test accuracy") == 2
    assert figures(nb) >= 2
    # Megatron-LM's pairs: the split network computes the unsplit one with one allreduce per
    # pair of layers; the naive split by columns needs an all-gather after every layer
    assert number(values, "tp_difference") < 1e-5 and number(values, "column_difference") < 1e-5
    assert number(values, "tp_exchanges") == number(values, "tp_layers") / 2 == 2
    assert number(values, "column_exchanges") == number(values, "tp_layers") == 4
    assert ("Megatron-LM pairs: 4 layers on 2 devices, 2 exchanges (numbers per device):\n"
            "  allreduce of 128, ") in text


def test_multiple_gpus_concise(page_outputs):
    nb, text, values = page_outputs("chapters/multiple-gpus-concise")
    # the lazy-layer pitfall is shown, and init_resnet refuses lazy layers
    assert "['LazyConv2d', 'ReLU', 'Flatten', 'LazyLinear']" in text
    assert "init_resnet on a lazy layer: ValueError" in text
    if not ON_GPU:
        assert "DataParallel uses device_ids []" in text
        # without GPUs nothing is trained with DataParallel, and the page says so
        assert "No GPU here, so this cell trained nothing" in text
        assert "DataParallel, 1 GPU" not in text
        assert "--nproc-per-node=2" in text and "backend gloo" in text
        assert number(values, "ddp_nproc") == 2
    if torch.cuda.device_count() == 1:  # one GPU: DataParallel has nothing to split, and says so
        assert "DataParallel uses device_ids [0]" in text
        assert "One GPU: DataParallel moves the input to it" in text
    # DDP trained for real: accuracy well above chance (0.1; the synthetic set is hard on
    # purpose), every rank with the same weights
    assert number(values, "ddp_acc_first") > 0.3
    assert number(values, "ddp_acc_last") > 0.3
    assert number(values, "ddp_sec_first") > 0 and number(values, "ddp_sec_last") > 0
    assert number(values, "ddp_distinct") == 1
    assert "all ranks hold bit-identical parameters and buffers: True" in text
    assert "SYNTHETIC" in text
    assert figures(nb) >= 1


def test_parameter_server(page_outputs):
    nb, text, values = page_outputs("chapters/parameter-server")
    # the ring allreduce ran in 4 processes and equals dist.all_reduce
    assert number(values, "ring_all_equal") == 4
    assert text.count("ring [15, 15, 15, 15], all_reduce [15, 15, 15, 15], equal: True") == 4
    assert number(values, "ring_float_diff") < 1e-9
    # the cost model was fitted to measurements
    assert number(values, "alpha_us") >= 0 and number(values, "beta_gbs") > 0
    assert "groups of [2, 3, 4]" in text or ON_GPU
    # the key-value store aggregated exactly and trained the linear model
    assert number(values, "kv_exact") == 3
    assert "server's final value: [6, 60, 900]" in text
    assert number(values, "kv_error") < 0.05
    assert number(values, "ms_ring_4") < number(values, "ms_one_4") < number(values, "ms_server_4")
    assert figures(nb) >= 4
