"""The pipeline definition: building, build-time errors, schemas, planner input."""

from __future__ import annotations

import pyarrow as pa
import pytest

from fissure import OperatorEstimate, Pipeline, PipelineError
from fissure.program.chain import output_schemas
from fissure.program.operators import Action, BatchFormat
from fissure.model.types import Kind, OperatorStats


def parse(record):
    return {"host": record["value"], "n": 1}


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return record


def test_chain_keeps_order_kinds_keys_and_schemas():
    pipeline = (Pipeline("p")
                .map("parse", parse, schema={"host": str, "n": int}, reads=["value"])
                .filter("keep", lambda record: True)
                .partitioned("per_host", count, key="host")
                .stateful("total", count, schema=pa.schema([("host", pa.string())]))
                .map_batches("vector", lambda batch: batch, format="pandas"))
    assert pipeline.names == ("parse", "keep", "per_host", "total", "vector")
    assert [op.kind for op in pipeline.operators] == [Kind.STATELESS, Kind.STATELESS, Kind.PARTITIONED,
                                                      Kind.STATEFUL, Kind.STATELESS]
    assert pipeline.operator("per_host").key == ("host",)
    assert pipeline.operator("per_host").action is Action.UPDATE
    assert pipeline.operator("vector").batch_format is BatchFormat.PANDAS
    assert pipeline.operator("parse").schema == pa.schema([("host", pa.string()), ("n", pa.int64())])


@pytest.mark.parametrize("build, words", [
    (lambda p: p.map("a", parse).map("a", parse), ["'a'", "twice"]),
    (lambda p: p.partitioned("per_host", count), ["'per_host'", "no key", "key="]),
    (lambda p: p.partitioned("per_host", count, key=[]), ["'per_host'", "no key"]),
    (lambda p: p.partitioned("per_host", count, key=5), ["'per_host'", "key must be a field name", "int 5"]),
    (lambda p: p.partitioned("per_host", count, key=b"host"), ["'per_host'", "key must be a field name"]),
    (lambda p: p.partitioned("per_host", count, key={"host"}), ["'per_host'", "key must be a field name"]),
    (lambda p: p.partitioned("per_host", count, key=["host", 5]), ["'per_host'", "non-empty strings"]),
    (lambda p: p.map("parse", count), ["'parse'", "count", "one argument"]),
    (lambda p: p.partitioned("c", parse, key="host"), ["'c'", "parse", "two arguments"]),
    (lambda p: p.map("x", 42), ["'x'", "not callable"]),
    (lambda p: p.map("bad name", parse), ["'bad name'", "not valid"]),
    (lambda p: p.map("m", parse, schema={"when": object}), ["'m'", "'when'", "unsupported field type"]),
    (lambda p: p.map("m", parse, schema={"_fissure_seq": int}), ["'m'", "reserves"]),
    (lambda p: p.map_batches("b", parse, format="polars"), ["'b'", "'arrow' or 'pandas'"]),
    (lambda p: p.filter("f", parse, selectivity=-1), ["'f'", "selectivity"]),
    (lambda p: p.partitioned("c", count, key="h", max_scale=0.5), ["'c'", "max_scale"]),
])
def test_definition_errors_name_the_operator_and_the_fix(build, words):
    with pytest.raises(PipelineError) as raised:
        build(Pipeline("p"))
    for word in words:
        assert word in str(raised.value)


def test_callables_with_defaults_or_varargs_are_accepted():
    pipeline = Pipeline().map("a", lambda record, scale=2: record).map("b", lambda *args: args[0]).map("c", len)
    assert len(pipeline) == 3


def test_schema_check_names_operator_and_missing_field():
    pipeline = (Pipeline("p").map("parse", parse, schema={"host": str, "n": int}, reads=["value"])
                .partitioned("per_user", count, key="user"))
    with pytest.raises(PipelineError) as raised:
        output_schemas(pipeline, pa.schema([("value", pa.string())]))
    message = str(raised.value)
    assert "'per_user'" in message and "'user'" in message and "keyed on" in message and "host, n" in message
    with pytest.raises(PipelineError, match="'parse'.*reads field 'value'"):
        output_schemas(pipeline, pa.schema([("line", pa.string())]))


def test_output_schemas_pass_through_undeclared_operators():
    source = pa.schema([("value", pa.string())])
    pipeline = Pipeline().filter("f", bool).map("m", parse, schema={"host": str, "n": int}).filter("g", bool)
    schemas = output_schemas(pipeline, source)
    assert schemas["f"] == source
    assert schemas["g"].names == ["host", "n"]


def test_operator_stats_from_estimates_hints_and_defaults():
    pipeline = (Pipeline().map("a", parse, cost_us=5.0).filter("b", bool, selectivity=0.5)
                .partitioned("c", count, key="host", max_scale=4))
    stats = pipeline.operator_stats({"a": OperatorEstimate(cost_us=7.0, selectivity=1.0)})
    assert stats == [
        OperatorStats("a", Kind.STATELESS, 7.0, 1.0),
        OperatorStats("b", Kind.STATELESS, 10.0, 0.5),
        OperatorStats("c", Kind.PARTITIONED, 10.0, 1.0, key=("host",), max_scale=4),
    ]
    with pytest.raises(PipelineError, match="zzz"):
        pipeline.operator_stats({"zzz": OperatorEstimate(1.0, 1.0)})


def test_empty_pipeline_cannot_be_planned():
    with pytest.raises(PipelineError, match="no operator"):
        Pipeline("empty").operator_stats()
