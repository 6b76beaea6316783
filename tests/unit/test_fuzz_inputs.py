"""Inputs that cannot crash the tools (tests/fuzz_inputs.py): damaged programs given to
`inspect`, `plan --pte` and `plan --model`, schema-fuzzed board files and damaged input
folders, each in a worker process limited to 1 GiB of address space and 10 s per case. Every
case ends in deploykit's own result or one of its classified errors: no traceback, no hang,
no memory blow-up, no dead worker.

A fixed sample of 300 cases (seed 31) here; `bench/soak --parts fuzz` runs 10,000
(docs/failures.md has its counts)."""

from __future__ import annotations

from collections import Counter

from tests.fuzz_inputs import make_cases, run_cases

SAMPLE, SEED = 300, 31


def test_the_cases_are_the_same_for_a_seed():
    first, again = make_cases(40, SEED), make_cases(40, SEED)
    assert [(c.ident, c.argv, c.files) for c in first] == \
        [(c.ident, c.argv, c.files) for c in again]
    kinds = Counter(c.ident.split()[1] for c in make_cases(SAMPLE, SEED))
    assert kinds == {"program": 180, "board": 60, "inputs": 60}


def test_no_damaged_input_crashes_the_tools(tmp_path):
    outcomes = run_cases(make_cases(SAMPLE, SEED), tmp_path)
    failed = [f"{o.ident}: {o.verdict} ({o.detail})" for o in outcomes if not o.passed]
    assert not failed, f"{len(failed)} of {SAMPLE} cases:\n" + "\n\n".join(failed)
    verdicts = Counter(o.verdict for o in outcomes)
    # Damage the formats tolerate ends well; the rest is refused: both happen in the sample.
    assert verdicts["ok"] > 0 and verdicts["error"] > 0
    assert max(o.seconds for o in outcomes) < 10
