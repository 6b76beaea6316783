"""Hardware-in-the-loop tests: the same file runs on QEMU, an FVP or a board.

    pytest tests/hil --board qemu-an547
    pytest tests/hil --board pico2 --dk-port /dev/ttyACM0
"""

import numpy as np
import pytest

from deploykit.pytest_plugin import ExpectError
from deploykit.readers.protocol.error_codes import BY_NAME as CODES_BY_NAME


def test_board_support_selftest(deployed, board):
    run = deployed(firmware="selftest")
    hello = run.expect("hello")
    assert hello.fields["board"] == board.name
    assert run.expect("done").status == 0
    assert run.report.passed, run.report.summary()
    with pytest.raises(ExpectError, match="Full console log"):
        run.expect("fault")


@pytest.mark.parametrize(("model", "flow"), [("tiny_cnn", "portable_fp32"),
                                             ("mlp_mnist", "cortex_m_int8")])
def test_model_matches_host(deployed, model, flow):
    run = deployed(model=model, flow=flow)
    assert run.expect("done").status == 0
    assert run.report.passed, run.report.summary()
    tensor = run.expect("tensor")
    assert np.isfinite(tensor.data.astype(np.float64)).all()


def test_a_fault_is_reported_with_its_registers(deployed):
    run = deployed(firmware="selftest", variant="fault")
    assert run.report.passed, run.report.summary()
    fault = run.expect("fault")
    assert fault.registers["cfsr"] & 0x00010000  # UsageFault: undefined instruction
    assert run.expect("done").status == 2
    run.expect(r"fault: UsageFault")


def test_an_error_record_closes_the_run(deployed):
    run = deployed(firmware="selftest", variant="error")
    assert run.report.passed, run.report.summary()
    error = run.expect("error")
    assert error.code == CODES_BY_NAME["SELFTEST"].code and "deliberate" in error.message
    assert run.expect("done").status == 1
