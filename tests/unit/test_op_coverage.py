"""The operator-coverage tables at export are the CMake build's: the same kernel_library() of
cmake/executorch_select_kernels.py on the same YAML files; and the error text."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from deploykit.readers.op_coverage import (
    _select_kernels,
    check_coverage,
    executorch_package_root,
    kernel_tables,
    model_line,
)
from deploykit.util.errors import ExitCode, OperatorCoverageError

REPO = Path(__file__).resolve().parents[2]

TRACE = textwrap.dedent("""\
    File "/somewhere/torch/nn/modules/module.py", line 1775, in _call_impl
        return forward_call(*args, **kwargs)
    File "/models/gru_kws.py", line 37, in forward
        out, _ = self.gru(x)
    File "/somewhere/torch/nn/modules/rnn.py", line 1393, in forward
        result = _VF.gru(
""")


def test_tables_classify_as_the_cmake_build_does():
    tables = kernel_tables()
    assert tables.library("aten::addmm.out") == "portable"
    assert tables.library("aten::avg_pool3d.out") == "deploykit"  # firmware/kernels
    assert tables.library("deploykit::quantized_layer_norm.out") == "deploykit"  # non-aten
    assert tables.library("cortex_m::quantized_linear.out") == "cortex_m"
    assert tables.library("executorch_prim::add.Scalar") == "prim"
    # The two operators of issue #20: no kernel in ExecuTorch v1.4.1's libraries.
    assert tables.library("aten::linear.out") is None
    assert tables.library("aten::sort.values") is None
    assert tables.library("quantized_decomposed::quantize_per_tensor.out") is None


def test_every_yaml_entry_is_covered():
    """Each operator of the kernel YAMLs the build reads is covered, by the library of
    that YAML (an entry the export did not know about would be a disagreement)."""
    tables = kernel_tables()
    for op in tables.portable:
        # deploykit's kernels replace the portable ones of the operators both have.
        if op in tables.deploykit:
            assert tables.library(op) == "deploykit", op
        else:
            assert tables.library(op) in ("portable", "prim"), op
    deploykit_yaml = yaml.safe_load((REPO / "firmware/kernels/functions.yaml").read_text())
    for entry in deploykit_yaml:
        op = entry.get("op") or entry["func"].split("(")[0]
        assert tables.library(op if "::" in op else "aten::" + op) == "deploykit", op
    # The copies that replace portable kernels (firmware/kernels/op_memory_order_copy.cpp).
    for op in ("aten::slice_copy.Tensor_out", "aten::cat.out", "aten::permute_copy.out",
               "dim_order_ops::_clone_dim_order.out"):
        assert op in tables.portable and tables.library(op) == "deploykit", op


def test_model_line_is_the_model_files_frame():
    assert (
        model_line(TRACE, Path("/models/gru_kws.py"))
        == "gru_kws.py:37 in forward: out, _ = self.gru(x)"
    )
    # Without the model file in the trace: the innermost frame.
    assert model_line(TRACE, Path("/elsewhere/other.py")).startswith(
        "/somewhere/torch/nn/modules/rnn.py:1393 in forward"
    )
    assert model_line("", Path("/models/gru_kws.py")) is None


def test_uncovered_operator_error_names_operator_why_and_fix():
    tables = kernel_tables()
    with pytest.raises(OperatorCoverageError) as e:
        check_coverage(
            ["aten::addmm.out", "aten::sort.values"], None, "sorter", None, "portable_fp32", tables
        )
    text = str(e.value)
    assert e.value.exit_code == ExitCode.UNSUPPORTED_OPERATOR == 15
    assert "aten::sort.values" in text and "aten::addmm.out" not in text
    assert "why: no kernel library of the runtime build implements it" in text
    assert "fix:" in text and "firmware/kernels/functions.yaml" in text
    assert "Nothing was planned or compiled" in text


def test_other_overload_is_named_in_why():
    tables = kernel_tables()
    with pytest.raises(OperatorCoverageError) as e:
        check_coverage(["aten::add.Scalar"], None, "m", None, "portable_fp32", tables)
    assert (
        "why: ExecuTorch's portable library implements aten::add.Scalar_out, "
        "aten::add.out but not this overload"
    ) in str(e.value)


@pytest.fixture
def executorch_sources() -> Path:
    """The ExecuTorch tree of the workspace the tool itself would use (--workspace, else
    $DEPLOYKIT_WORKSPACE, else the default `deploykit setup` fills): the CMake gate script
    reads the source tree."""
    from deploykit.readers.sources import load_workspace
    from deploykit.util.errors import DeployKitError

    try:
        tree = load_workspace().executorch_dir
    except DeployKitError as exc:
        pytest.skip(f"needs the ExecuTorch sources (`deploykit setup`): {exc.cause}")
    assert (tree / "kernels/portable/functions.yaml").is_file(), f"{tree} is incomplete"
    return tree


def test_cmake_gate_and_export_check_agree(executorch_sources, tmp_path):
    """The CMake script on the source tree and the export's check on the package's files
    reject the same operators of one operator list."""
    ops = [
        "aten::addmm.out",
        "aten::linear.out",
        "aten::sort.values",
        "cortex_m::quantized_linear.out",
        "aten::avg_pool3d.out",
        "aten::sym_size.int",
    ]
    ops_yaml = tmp_path / "ops.yaml"
    ops_yaml.write_text(
        yaml.safe_dump({"include_all_operators": False, "operators": {o: {} for o in ops}})
    )
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "cmake/executorch_select_kernels.py"),
            f"--ops-yaml={ops_yaml}",
            f"--executorch-root={executorch_sources}",
            "--cortex-m",
            f"--extra-functions-yaml={REPO / 'firmware/kernels/functions.yaml'}",
            f"--extra-kernels-dir={REPO / 'firmware/kernels'}",
            f"--output={tmp_path / 'sel.cmake'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    cmake_missing = set(run.stderr.split("no kernel for: ")[1].strip().split(", "))
    tables = kernel_tables(executorch_sources)
    assert tables.prim_ops_exact
    export_missing = {o for o in ops if tables.library(o) is None}
    assert cmake_missing == export_missing == {"aten::linear.out", "aten::sort.values"}


def test_the_codegen_yaml_registers_each_operator_once():
    """The FUNCTIONS_YAML the registration codegen reads when deploykit's kernels are used:
    a portable entry that deploykit replaces is left out (the codegen refuses two)."""
    sel = _select_kernels()
    portable_yaml = executorch_package_root() / "kernels/portable/functions.yaml"
    merged = yaml.safe_load(sel.merged_functions_yaml(
        portable_yaml, REPO / "firmware/kernels/functions.yaml"))
    ops = [e.get("op") or e["func"].split("(")[0] for e in merged]
    assert len(ops) == len(set(ops))
    kernels = {op: e["kernels"][0]["kernel_name"] for op, e in zip(ops, merged, strict=True)}
    assert kernels["cat.out"] == "torch::executor::dk_cat_out"
    assert kernels["slice_copy.Tensor_out"] == "torch::executor::dk_slice_copy_Tensor_out"
    assert kernels["add.out"] == "torch::executor::add_out"  # the portable ones stay
    # + avg_pool3d.out and deploykit's own int8 LayerNorm
    assert len(ops) == len(sel.entries(portable_yaml)) + 2
    assert kernels["deploykit::quantized_layer_norm.out"] == \
        "torch::executor::dk_quantized_layer_norm_out"
    assert kernels["permute_copy.out"] == "torch::executor::dk_permute_copy_out"
