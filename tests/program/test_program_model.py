"""One program model: a chain (fissure.Pipeline) is a face over a StreamGraph, and the package
fissure.program stands on its own (no Spark, no runtime, no import back up)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import fissure
from fissure import Count, Pipeline, PipelineError, StreamGraph, Tumbling
from fissure.model.types import Kind, OperatorStats
from fissure.program.graph import as_graph
from fissure.program.operators import DEFAULT_COST_US

PROGRAM_DIR = pathlib.Path(fissure.__file__).parent / "program"


def _chain() -> Pipeline:
    return (Pipeline("p")
            .map("parse", lambda r: r, cost_us=2.0)
            .filter("none_pass", lambda r: False, selectivity=0.0)
            .filter("half", lambda r: True, selectivity=0.5)
            .partitioned("count", lambda state, r: None, key="k", schema={"k": str, "n": int}, max_scale=4.0))


def test_a_pipeline_is_the_graph_it_builds():
    chain = _chain()
    graph = chain.graph
    assert isinstance(graph, StreamGraph) and as_graph(chain) is graph and StreamGraph.from_pipeline(chain) is not graph
    assert graph.sources == ("source",) and graph.sinks == ("sink",)
    assert graph.sink_node("sink").inputs == ("count",)  # the sink follows the last operator
    assert graph.names == chain.names == ("parse", "none_pass", "half", "count")
    assert graph.operators == chain.operators and chain.operator("count") is graph.node("count").operator
    chain.map("after", lambda r: r)
    assert graph.sink_node("sink").inputs == ("after",) and graph.names[-1] == "after"


def test_the_planner_input_is_the_graphs_and_keeps_each_operators_own_selectivity():
    """One operator_stats: a chain's is its graph's, and a link that receives nothing (after a
    filter of selectivity 0) still shows its own selectivity, as the chain declared it."""
    chain = _chain()
    stats = chain.operator_stats()
    assert stats == chain.graph.operator_stats()
    assert stats == [
        OperatorStats("parse", Kind.STATELESS, 2.0, 1.0),
        OperatorStats("none_pass", Kind.STATELESS, DEFAULT_COST_US, 0.0),
        OperatorStats("half", Kind.STATELESS, DEFAULT_COST_US, 0.5),
        OperatorStats("count", Kind.PARTITIONED, DEFAULT_COST_US, 1.0, key=("k",), max_scale=4.0),
    ]
    with pytest.raises(PipelineError, match="estimates name operators the pipeline does not have: nope"):
        chain.operator_stats({"nope": fissure.OperatorEstimate(1.0, 1.0)})


def test_an_operator_named_like_an_end_moves_the_end_as_the_chain_grows():
    chain = Pipeline("p").map("source_", lambda r: r).map("source", lambda r: r).map("sink", lambda r: r)
    assert chain.graph.sources == ("source__",) and chain.graph.sinks == ("sink_",)
    assert chain.graph.node("source_").inputs == ("source__",)
    assert chain.graph.names == ("source_", "source", "sink")
    assert fissure.run_local(chain, [{"v": 1}])["sink_"] == [{"v": 1}]


def test_a_stream_and_a_chain_build_the_same_operator_with_the_same_checks():
    chain = Pipeline("p").event_time("ts", lateness=2.0).window("w", key="k", window=Tumbling(5.0), aggregate=Count())
    graph = StreamGraph("g")
    graph.source("events").event_time("ts", lateness=2.0).window("w", key="k", window=Tumbling(5.0),
                                                                   aggregate=Count()).sink("out")
    built = {name: graph.node(name).operator for name in graph.names}
    for operator in chain.operators:
        assert built[operator.name].describe() == operator.describe()
        assert built[operator.name].time == operator.time
    for face in (Pipeline("p"), StreamGraph("g").source("s")):
        with pytest.raises(PipelineError, match="needs event time"):
            face.window("w", key="k", window=Tumbling(5.0), aggregate=Count())
        with pytest.raises(PipelineError, match="must take exactly one argument"):
            face.map("m", lambda a, b: a)


def test_a_chain_shaped_graph_gives_its_chain_back_and_other_graphs_are_refused():
    chain = _chain()
    back = Pipeline.from_graph(chain.graph)
    assert back.names == chain.names and back.operators == chain.operators
    fan = StreamGraph("fan")
    stream = fan.source("in").map("a", lambda r: r)
    stream.sink("a")
    stream.map("b", lambda r: r).sink("b")
    assert fan.chain_operators() is None
    with pytest.raises(PipelineError, match="is not a chain"):
        Pipeline.from_graph(fan)


def test_only_programs_become_graphs():
    with pytest.raises(PipelineError, match="has no operator"):
        as_graph(Pipeline("empty"))
    with pytest.raises(PipelineError, match="a program is a fissure.Pipeline or a fissure.StreamGraph, got list"):
        as_graph([])


def _imports(path: pathlib.Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {module for module in modules if module.startswith("fissure")}


def test_the_program_model_imports_nothing_above_it_and_its_bottom_nothing_of_it():
    """The model has no Spark, no runtime, no control loop in it: fissure.program imports only
    itself and fissure.model; fissure.program.operators, the bottom, none of its siblings."""
    for path in PROGRAM_DIR.glob("*.py"):
        outside = {module for module in _imports(path) if not module.startswith(("fissure.program", "fissure.model"))}
        assert not outside, (path.name, outside)
    assert not {module for module in _imports(PROGRAM_DIR / "operators.py") if module.startswith("fissure.program")}
