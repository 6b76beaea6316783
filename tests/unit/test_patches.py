"""Patch-based execution of the first stage (flows/patches.py), on float graphs: the tiled
graph computes what the model computes over stride, padding, dilation, depthwise, pooling and
residual cases; the stage ends where tiling cannot go on, and `auto` says why it leaves a model
alone; a bad grid is a clear error. The int8 bit-exactness is checked on the device
(tests/integration/test_patches_qemu.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from deploykit.flows.patches import (
    AUTO,
    METHOD_BYTES_PER_COPY,
    METHOD_BYTES_PER_INSTRUCTION,
    OFF,
    ORIGIN_KEY,
    Tiler,
    apply_patches,
    describe,
    estimate_peak,
    find_stages,
    parse_patches,
    plan_patches,
)
from deploykit.util.errors import ConfigError

ATEN = torch.ops.aten


def _graph(module: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    return torch.export.export(module.eval(), (x,)).module(check_guards=False)


def _tiled(module: nn.Module, x: torch.Tensor, grid: tuple[int, int], split: int = -1
           ) -> torch.fx.GraphModule:
    """`module` with its stage up to its `split`-th possible split (default: the last) in
    tiles of `grid`."""
    graph_module = _graph(module, x)
    stages = find_stages(graph_module)
    apply_patches(graph_module, plan_patches(stages.stage(stages.splits[split]), grid))
    return graph_module


def _count(graph_module: torch.fx.GraphModule, target) -> int:
    return sum(1 for n in graph_module.graph.nodes if n.target == target)


class Residual(nn.Module):
    """An inverted-residual block: 1x1 expand, 3x3 depthwise, 1x1 project, plus its input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 2 * channels, 1), nn.ReLU6(),
            nn.Conv2d(2 * channels, 2 * channels, 3, padding=1, groups=2 * channels),
            nn.ReLU6(), nn.Conv2d(2 * channels, channels, 1))

    def forward(self, x):
        return x + self.body(x)


def _net(*layers: nn.Module) -> nn.Module:
    """The layers, then a global pooling and a linear layer (where tiling must stop)."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            return self.pool(self.features(x)).flatten(1)

    return Net()


CASES = {
    "stride 2, padding 1": (_net(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 8, 3, padding=1)), 33),
    "no padding, kernel 5": (_net(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.Conv2d(6, 6, 3)), 30),
    "dilation 2": (_net(nn.Conv2d(3, 6, 3, padding=2, dilation=2), nn.Hardtanh(0, 6),
                        nn.Conv2d(6, 6, 3, padding=1, stride=2)), 29),
    "depthwise and pointwise, BatchNorm": (
        _net(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
             nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
             nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1,
                                                        groups=16)), 40),
    "max pooling": (_net(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(3, stride=2, padding=1), nn.Conv2d(8, 8, 3)), 31),
    "average pooling": (_net(nn.Conv2d(3, 8, 3, padding=1), nn.AvgPool2d(2),
                             nn.Conv2d(8, 8, 3, padding=1),
                             nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)),
                        32),
    "uneven kernel and stride": (_net(nn.Conv2d(3, 8, (3, 5), stride=(2, 1), padding=(1, 2)),
                                      nn.Conv2d(8, 8, (1, 3), stride=(1, 3))), 27),
    "residual block": (_net(nn.Conv2d(3, 8, 3, stride=2, padding=1), Residual(8),
                            Residual(8)), 36),
}


@pytest.mark.parametrize("grid", [(2, 2), (3, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_graph_equals_the_model(name, grid):
    torch.manual_seed(0)
    module, size = CASES[name]
    with torch.no_grad():
        for m in module.modules():  # BatchNorm statistics that are not the identity
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, size, size + 3)
    stages = find_stages(_graph(module, x))
    assert stages.splits, stages.stop
    for split in range(len(stages.splits)):
        tiled = _tiled(module, x, grid, split)
        assert _count(tiled, ATEN.slice.Tensor) >= 1
        with torch.no_grad():
            assert torch.allclose(tiled(x), module(x), rtol=0, atol=1e-5), (split, grid)


def test_each_tile_runs_before_the_next_and_reads_the_same_weights():
    torch.manual_seed(0)
    module, size = CASES["stride 2, padding 1"]
    x = torch.randn(1, 3, size, size)
    tiled = _tiled(module, x, (2, 2))
    convs = [n for n in tiled.graph.nodes if n.target == ATEN.conv2d.default]
    assert len(convs) == 2 * 4  # two layers, four tiles
    # Graph order: tile after tile, the whole stage of a tile before the next.
    layers = [n.meta[ORIGIN_KEY] for n in convs]
    assert layers == [layers[0], layers[1]] * 4

    def weight(n: torch.fx.Node) -> torch.Tensor:
        return tiled.get_parameter(n.args[1].target)

    # Every tile's copy of a weight holds the same values as the first tile's.
    first = {n.meta[ORIGIN_KEY]: weight(n) for n in convs[:2]}
    for n in convs[2:]:
        assert torch.equal(weight(n), first[n.meta[ORIGIN_KEY]])


def test_zero_padding_only_at_the_map_border():
    """A tile inside the map reads real neighbours: its convolutions are unpadded on every
    side inside the map."""
    torch.manual_seed(0)
    module = _net(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1))
    x = torch.randn(1, 3, 30, 30)
    tiled = _tiled(module, x, (3, 3))
    paddings = [tuple(n.args[4]) for n in tiled.graph.nodes if n.target == ATEN.conv2d.default]
    assert paddings.count((0, 0)) == 2  # the centre tile, both layers
    assert (1, 1) in paddings  # corner tiles pad (at the border)
    with torch.no_grad():
        assert torch.allclose(tiled(x), module(x), atol=1e-5)


def test_the_stage_ends_at_a_global_operator():
    module, size = CASES["max pooling"]
    stages = find_stages(_graph(module, torch.randn(1, 3, size, size)))
    assert "adaptive_avg_pool2d" in stages.stop
    assert stages.nodes[stages.splits[-1]].node.name.startswith("conv2d")


def test_auto_leaves_a_model_it_cannot_tile_and_says_why():
    class Reshaping(nn.Module):
        def forward(self, x):
            return torch.relu(x.reshape(1, 3, -1, 8))

    graph_module = _graph(Reshaping(), torch.randn(1, 3, 16, 16))
    before = str(graph_module.graph)
    tiler = Tiler(AUTO, quantized=True, plan_inputs=False, int8_inputs=True)
    assert tiler.rewrite(graph_module) is False
    assert str(graph_module.graph) == before
    assert "cannot be tiled" in tiler.report["reason"] or "reshap" in tiler.report["reason"]
    with pytest.raises(ConfigError, match="cannot be tiled"):
        Tiler("2x2", quantized=True, plan_inputs=False, int8_inputs=True).rewrite(graph_module)


def test_auto_leaves_a_model_whose_peak_tiles_do_not_lower():
    # A small map whose later layer is the largest: the peak is not in the first stage.
    module = _net(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 64, 1))
    graph_module = _graph(module, torch.randn(1, 3, 8, 8))
    tiler = Tiler(AUTO, quantized=True, plan_inputs=False, int8_inputs=True)
    assert tiler.rewrite(graph_module) is False
    assert "do not lower the peak" in tiler.report["reason"]


def test_auto_lowers_the_peak_within_the_mac_budget():
    module, size = CASES["depthwise and pointwise, BatchNorm"]
    x = torch.randn(1, 3, 4 * size, 4 * size)
    graph_module = _graph(module, x)
    tiler = Tiler(AUTO, quantized=True, plan_inputs=False, int8_inputs=True)
    untiled = copy.deepcopy(graph_module)
    assert tiler.rewrite(graph_module) is True
    report = tiler.report
    assert report["estimated_peak"] < report["estimated_peak_without"]
    assert 0 <= report["mac_overhead"] <= 0.25
    with torch.no_grad():
        assert torch.allclose(graph_module(x), untiled(x), atol=1e-5)


def test_estimate_is_the_live_peak_of_a_plain_chain():
    # int8: input read in place (0 B), conv 8x16x16, ReLU fused, conv 4x16x16.
    module = _net(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
    graph_module = _graph(module, torch.randn(1, 3, 16, 16))
    tiler = Tiler(AUTO, quantized=True, plan_inputs=False, int8_inputs=True)
    assert estimate_peak(graph_module, tiler.element, fused=tiler.fused) == 8 * 256 + 4 * 256


@pytest.mark.parametrize("value, expected", [("auto", AUTO), ("off", OFF), (None, OFF),
                                             ("3x2", (3, 2)), (" 2X4 ", (2, 4))])
def test_parse_patches(value, expected):
    assert parse_patches(value) == expected


@pytest.mark.parametrize("value", ["1x1", "0x2", "3", "x2", "2x2x2", "big"])
def test_parse_patches_refuses(value):
    with pytest.raises(ConfigError, match="--patches"):
        parse_patches(value)


def test_a_grid_larger_than_the_map_is_an_error():
    module = _net(nn.Conv2d(3, 4, 3, stride=2, padding=1))
    graph_module = _graph(module, torch.randn(1, 3, 8, 8))
    stages = find_stages(graph_module)
    with pytest.raises(ConfigError, match="larger than the map"):
        plan_patches(stages.stage(stages.splits[-1]), (5, 2))
    with pytest.raises(ConfigError, match="larger than the map"):
        Tiler("9x1", quantized=False, plan_inputs=False, int8_inputs=False).rewrite(
            graph_module)


def test_the_ethos_u_flow_refuses_patches_with_the_reason():
    from deploykit.pipeline.target import resolve_target

    with pytest.raises(ConfigError, match="ethos_u_int8 flow cannot run patches: Vela"):
        resolve_target("corstone-320", flow="ethos_u_int8", patches="auto")


def test_patches_reach_the_export_options():
    from deploykit.pipeline.target import resolve_target

    target = resolve_target("qemu-an505", flow="cortex_m_int8", patches="3X2")
    assert target.profile.export_options().patches == "3x2"
    assert "patches=3x2" in target.profile.export_options().key()
    plain = resolve_target("qemu-an505", flow="cortex_m_int8")
    assert plain.profile.export_options().patches == OFF
    assert "patches" not in plain.profile.export_options().key()  # the cache key of today
    with pytest.raises(ConfigError, match="--patches 3by2: not a tile grid"):
        resolve_target("qemu-an505", flow="cortex_m_int8", patches="3by2")


def test_the_project_file_sets_patches(tmp_path):
    from deploykit import api

    project = tmp_path / "deploykit.toml"
    project.write_text('board = "qemu-an505"\nflow = "cortex_m_int8"\npatches = "2x2"\n')
    cmd = api.command(project=project, needs_model=False)
    assert cmd.target.profile.patches == "2x2"
    project.write_text('board = "qemu-an505"\npatches = "2x"\n')
    with pytest.raises(ConfigError):
        api.command(project=project, needs_model=False)


def test_more_tiles_cost_more_method_pool_and_the_report_says_so():
    module, size = CASES["depthwise and pointwise, BatchNorm"]
    graph_module = _graph(module, torch.randn(1, 3, 4 * size, 4 * size))
    stages = find_stages(graph_module)
    stage = stages.stage(stages.splits[-1])
    tiler = Tiler(AUTO, quantized=True, plan_inputs=False, int8_inputs=True)
    growth = [tiler.method_growth(plan_patches(stage, grid)) for grid in [(1, 2), (2, 2),
                                                                          (3, 3)]]
    assert 0 < growth[0] < growth[1] < growth[2]
    assert tiler.rewrite(graph_module)
    lines = describe(tiler.report, planned=1000, bound=900)
    assert lines[0].startswith(f"patches: {tiler.report['grid']} tiles up to ")
    assert "planned 1,000 B with patches (lower bound 900 B)" in lines[1]
    assert describe({"setting": "auto", "reason": "left unpatched: x"}) == [
        "patches auto: left unpatched: x"]


# ---- a single row of tiles over a chain carries its overlap ----

CHAINS = {
    "stride 1, padding 1": nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                         nn.Conv2d(8, 8, 3, padding=1)),
    "stride 2, depthwise": nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 16, 1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), nn.Conv2d(16, 16, 1)),
    "padding 0 and 2, kernel 5": nn.Sequential(nn.Conv2d(3, 6, 5, padding=2), nn.ReLU(),
                                               nn.Conv2d(6, 6, 3), nn.Conv2d(6, 6, 5)),
    "dilation 2": nn.Sequential(nn.Conv2d(3, 6, 3, padding=2, dilation=2), nn.Hardtanh(0, 6),
                                nn.Conv2d(6, 6, 3, padding=1, stride=2, dilation=2)),
    "1x1 with stride 2": nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 1, 2),
                                       nn.Conv2d(6, 6, 3, stride=2, padding=1)),
    "max and average pooling": nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, stride=2),
        nn.Conv2d(6, 6, 3, padding=1), nn.AvgPool2d(2), nn.Conv2d(6, 6, 3, padding=1)),
    # A pooling pads with what is not a zero (max) or leaves the padding out of its divisor:
    # at the borders the layers run with their own padding.
    "padded pooling": nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(6, 6, 3, padding=1),
        nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)),
}


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_carried_tiles_equal_the_model_without_recomputing(name, parts):
    torch.manual_seed(0)
    module = _net(*CHAINS[name])
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    for width in (47, 64):  # 5 tiles of at least 2 columns at every split
        x = torch.randn(1, 3, 21, width)
        graph_module = _graph(module, x)
        stages = find_stages(graph_module)
        plan = plan_patches(stages.stage(stages.splits[-1]), (1, parts))
        assert plan.carries, (name, width)
        # A tile computes only columns no tile before it has, but for the few a layer with
        # column padding computes from it at a border, on the side inside the map (cut off).
        for s in plan.stage.nodes:
            if s.windows is not None:
                w = s.windows[1]
                computed = sum(steps[s.node].computed[1] - steps[s.node].computed[0]
                               for steps in plan.cols.carry)
                assert computed <= s.shape[3] + w.padding // w.stride + \
                    -(-w.padding // w.stride), (name, s.node.name)
        assert plan.stage_macs <= plan.macs <= 1.1 * plan.stage_macs
        apply_patches(graph_module, plan)
        with torch.no_grad():
            assert torch.allclose(graph_module(x), module(x), rtol=0, atol=1e-5), (name, width)


def test_carried_tiles_of_an_unpadded_chain_compute_the_models_macs():
    module = _net(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8),
                  nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 5, stride=2), nn.MaxPool2d(2))
    graph_module = _graph(module, torch.randn(1, 3, 24, 40))
    stages = find_stages(graph_module)
    for split in stages.splits:
        for parts in (2, 3, 4):
            plan = plan_patches(stages.stage(split), (1, parts))
            assert plan.carries and plan.macs == plan.stage_macs, (split, parts)


def test_carried_columns_are_cut_and_joined_as_their_layer_input():
    """The tiles' convolutions pad columns only at the map's borders, every copy quantizes
    as the tensor it copies (its origin), and a tile joins the columns kept from the tile
    before it."""
    torch.manual_seed(0)
    module = _net(*CHAINS["stride 1, padding 1"])
    x = torch.randn(1, 3, 16, 24)
    tiled = _tiled(module, x, (1, 3))
    convs = [n for n in tiled.graph.nodes if n.target == ATEN.conv2d.default]
    assert [tuple(n.args[4]) for n in convs] == [(1, 1)] * 2 + [(1, 0)] * 2 + [(1, 1)] * 2
    joins = [n for n in tiled.graph.nodes if n.target == ATEN.cat.default]
    assert len(joins) == 2 + 1  # the second layer of tiles 2 and 3, then the tiles
    for join in joins[:-1]:
        kept, own = join.args[0]
        assert kept.target == ATEN.slice.Tensor
        assert kept.meta[ORIGIN_KEY] == own.meta[ORIGIN_KEY] == join.meta[ORIGIN_KEY]
    assert not [n for n in tiled.graph.nodes if n.target == ATEN.constant_pad_nd.default]
    with torch.no_grad():
        assert torch.allclose(tiled(x), module(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("layers, grid, why", [
    ((nn.Conv2d(3, 8, 3, padding=1), Residual(8)), (1, 3), "joins two branches"),
    ((nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)), (2, 2),
     "several rows"),
])
def test_tiles_recompute_their_overlap_where_they_cannot_carry_it(layers, grid, why):
    torch.manual_seed(0)
    module = _net(*layers)
    x = torch.randn(1, 3, 16, 20)
    graph_module = _graph(module, x)
    tiler = Tiler(f"{grid[0]}x{grid[1]}", quantized=False, plan_inputs=False,
                  int8_inputs=False)
    assert tiler.rewrite(graph_module)
    assert tiler.report["overlap"].startswith("recomputed") and why in tiler.report["overlap"]
    assert "recompute their overlap" in describe(tiler.report)[0]
    with torch.no_grad():
        assert torch.allclose(graph_module(x), module(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("width, parts", [(5, 5), (9, 4)])
def test_tiles_too_narrow_to_carry_recompute_their_overlap(width, parts):
    """5 tiles over 5 columns of two kernel-5 layers: the 4th tile's first layer already
    reaches the map's last column, so the 5th would have no column of its own: these tiles
    recompute their overlap, with the same outputs."""
    torch.manual_seed(0)
    module = _net(nn.Conv2d(3, 8, 5, padding=2), nn.ReLU(), nn.Conv2d(8, 8, 5, padding=2))
    x = torch.randn(1, 3, 8, width)
    graph_module = _graph(module, x)
    stages = find_stages(graph_module)
    plan = plan_patches(stages.stage(stages.splits[-1]), (1, parts))
    assert not plan.carries
    assert plan.macs > plan.stage_macs
    apply_patches(graph_module, plan)
    with torch.no_grad():
        assert torch.allclose(graph_module(x), module(x), rtol=0, atol=1e-5)


def _live_peak(graph_module: torch.fx.GraphModule, element: int) -> int:
    """The most bytes live at once over the graph's nodes in order (the input read in place)."""
    nodes = [n for n in graph_module.graph.nodes if n.op in ("placeholder", "call_function")]
    last = {a: i for i, n in enumerate(nodes) for a in n.all_input_nodes}
    size = {n: 0 if n.op == "placeholder" else
            torch.Size(n.meta["val"].shape).numel() * element for n in nodes}
    live = peak = 0
    for i, n in enumerate(nodes):
        live += size[n]
        peak = max(peak, live)
        live -= sum(size.get(a, 0) for a in {*n.all_input_nodes, n} if last.get(a, i) <= i)
    return peak


@pytest.mark.parametrize("parts", [2, 4])
def test_the_estimate_of_carried_tiles_is_their_graphs_live_peak(parts):
    module = _net(*CHAINS["stride 2, depthwise"])
    x = torch.randn(1, 3, 64, 64)
    graph_module = _graph(module, x)
    tiler = Tiler(f"1x{parts}", quantized=False, plan_inputs=False, int8_inputs=False)
    assert tiler.rewrite(graph_module)
    assert tiler.report["overlap"] == "carried"
    assert tiler.report["stage_macs"] <= tiler.report["tiled_stage_macs"] <= \
        1.05 * tiler.report["stage_macs"]
    assert tiler.report["estimated_peak"] == _live_peak(graph_module, 4)
    assert "the tiles carry their overlap" in describe(tiler.report)[0]
    # The instructions the method pool is charged for are the graph's.
    def ops(graph: torch.fx.GraphModule, copies: bool) -> int:
        return sum(1 for n in graph.graph.nodes if n.op == "call_function" and
                   (n.target in (ATEN.slice.Tensor, ATEN.cat.default)) == copies)

    plain = _graph(module, x)
    assert tiler.report["estimated_method_pool_growth"] == \
        (ops(graph_module, False) - ops(plain, False)) * METHOD_BYTES_PER_INSTRUCTION + \
        ops(graph_module, True) * METHOD_BYTES_PER_COPY
