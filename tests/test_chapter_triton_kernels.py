"""The page chapters/triton-kernels, as the book build ran it, and on a GPU.

Every kernel must match PyTorch: on a CPU in Triton's interpreter, which the page must name,
on small sizes that are not multiples of the blocks (so the masks matter); on a GPU also at the
sizes it times. The counts behind the roofline hold on any machine; a CPU run states no speed,
and says that the interpreter showed neither the race nor the shared-memory limit.
"""
import math

import pytest

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/triton-kernels"
KERNELS = ("add", "softmax", "matmul", "attention")


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def check_page(nb, text, values):
    """What holds on any device: the kernels match PyTorch, the counts are right."""
    on_gpu = values["on_gpu"] == "True"
    assert "Run profile" in text and "device:" in text
    assert figures(nb) >= 2  # the grid of the matrix product, the roofline
    # The small checks: sizes that the blocks do not divide, so the last programs are masked.
    assert number(values, "add_n") % number(values, "add_block") != 0
    assert number(values, "attn_seq") % 16 != 0
    assert "vector add, 5000 elements in 5 programs of 1024: matches x + y" in text
    assert "matches torch.softmax" in text and "matches a @ b" in text
    assert "matches SDPA" in text
    assert number(values, "add_err") == 0  # one rounded addition, the same everywhere
    assert 0 <= number(values, "softmax_err") < 1e-6
    # float32 products: the interpreter multiplies in float32; a GPU's tl.dot in TF32 by default
    assert 0 <= number(values, "matmul_err") < (5e-2 if on_gpu else 1e-4)
    assert 0 <= number(values, "attention_err") < (1e-2 if on_gpu else 1e-5)
    # The fused softmax moves one read and one write per element; written out, four times that.
    assert number(values, "softmax_fused_bytes") == 8
    assert number(values, "softmax_bytes_ratio") == pytest.approx(4, rel=0.05)
    # The counts behind the roofline, at the sizes the GPU run times.
    assert number(values, "add_intensity") == pytest.approx(1 / 12)
    assert number(values, "softmax_intensity") == pytest.approx(5 / 8)
    assert number(values, "matmul_intensity") == pytest.approx(4096 / 3)  # n/3 in float16
    assert number(values, "attention_intensity") == pytest.approx(4096 / 2)  # S/2 in float16
    assert number(values, "h100_ridge") == pytest.approx(989.5 / 3.35, rel=1e-3)
    # The atomic sum is right everywhere; the racy one may lose updates only on a GPU.
    assert number(values, "atomic_total") == number(values, "sum_n")
    assert number(values, "racy_total") <= number(values, "sum_n")
    return on_gpu


def test_every_kernel_matches_pytorch_in_the_interpreter(page):
    nb, text, values = page
    on_gpu = check_page(nb, text, values)
    if on_gpu:
        pytest.skip("this build ran on a GPU")
    assert values["interpreted"] == "True"
    assert "kernels run in Triton's interpreter on the CPU, on small sizes" in text
    assert "16 programs" in text  # the sums of 4,096 ones in blocks of 256


def test_a_cpu_run_times_nothing_and_says_what_the_interpreter_hides(page):
    _, text, values = page
    if values["on_gpu"] == "True":
        pytest.skip("this build ran on a GPU")
    assert "no CUDA device on this run" in text
    for key in KERNELS:
        assert values[f"{key}_speed_verdict"].strip("'\"") == "not timed, since this run had no GPU"
        assert math.isnan(number(values, f"{key}_speedup"))
    # programs run one after another: no update is lost, and no shared memory runs out
    assert number(values, "racy_total") == number(values, "sum_n")
    assert values["race_verdict"].strip("'\"").startswith("gave the right total")
    assert values["smem_outcome"].strip("'\"") == "ran"
    assert values["smem_verdict"].strip("'\"").startswith("ran it without complaint")
    outlook = values["roof_outlook"].strip("'\"")
    assert outlook.startswith("This run had no GPU") and "can be expected" in outlook


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): compiled kernels, autotuning, timings."""
    nb = execute_chapter("triton-kernels", monkeypatch, timeout=900)
    text, values = page_text(nb), glued(nb)
    assert check_page(nb, text, values)
    assert values["interpreted"] == "False" and "kernels are compiled for the GPU" in text
    assert "autotuned matmul at 4096: chose" in text
    # at the timed sizes, each kernel's output against PyTorch's, relative to its largest entry
    assert number(values, "add_gpu_err") == 0
    assert number(values, "softmax_gpu_err") < 1e-5
    assert number(values, "matmul_gpu_err") < 1e-2  # float16 results rounded apiece
    assert number(values, "attention_gpu_err") < 1e-2
    for key in KERNELS:
        assert number(values, f"{key}_speedup") > 0
        assert 0 < number(values, f"{key}_share") < 150  # a share of the measured roof, in %
        assert "not timed" not in values[f"{key}_speed_verdict"]
    assert not values["roof_outlook"].strip("'\"").startswith("This run had no GPU")
    assert "interpreter" not in values["smem_verdict"]
