"""The OTLP profiles request of prefix profiles (dask_otel_spans/protocol/otlpprofiles.py),
decoded with the ``opentelemetry-proto`` package: the call trees' stacks and counts,
each sample's link to its prefix span, the resource and the profile attributes."""
from __future__ import annotations

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)
from opentelemetry.proto.profiles.v1development.profiles_pb2 import Sample

from dask_otel_spans import names
from dask_otel_spans.protocol.otlpprofiles import SAMPLE_FIELDS, LinkedProfile, profiles_request
from dask_otel_spans.protocol.profiles import Frame, from_stacks, stacks

MAIN = Frame("run", "/site-packages/distributed/worker.py", 10)
HOT = Frame("hot_loop", "/work/jobs.py", 3)
SLEEP = Frame("sleep", "/work/jobs.py", 20)
#: ``Sample``'s field numbers as the installed ``opentelemetry-proto`` has them
PACKAGE_SAMPLE_FIELDS = {f.name: f.number for f in Sample.DESCRIPTOR.fields}


def linked(tree_stacks, span_id: int, prefix: str) -> LinkedProfile:
    return LinkedProfile(from_stacks(tree_stacks), 0x0AF7651916CD43DD8448EB211C80319C,
                         span_id, 1_000, 3_000, {names.TASK_PREFIX: prefix})


def decoded(data: bytes):
    request = ExportProfilesServiceRequest.FromString(data)
    d = request.dictionary
    strings = list(d.string_table)

    def frames(stack_index: int) -> tuple[str, ...]:
        locations = d.stack_table[stack_index].location_indices
        # (innermost first on the wire; outermost first here, as stacks() says)
        return tuple(strings[d.function_table[d.location_table[i].lines[0].function_index]
                             .name_strindex] for i in reversed(locations))

    out = []
    for profile in request.resource_profiles[0].scope_profiles[0].profiles:
        links = {(d.link_table[s.link_index].trace_id, d.link_table[s.link_index].span_id)
                 for s in profile.samples}
        attributes = {strings[d.attribute_table[i].key_strindex]:
                      d.attribute_table[i].value.string_value
                      for i in profile.attribute_indices}
        out.append(({frames(s.stack_index): list(s.values) for s in profile.samples},
                    links, attributes))
    return request, out


def test_request_holds_each_call_trees_stacks_and_counts_linked_to_its_span():
    inc = linked([((MAIN, HOT), 7), ((MAIN,), 2)], 0x00F067AA0BA902B7, "inc")
    slow = linked([((MAIN, SLEEP), 5)], 0x1111222233334444, "slow")
    request, profiles = decoded(profiles_request(
        [inc, slow], {"service.name": "dask"}, ("dask_otel_spans", "1.0"),
        PACKAGE_SAMPLE_FIELDS))
    trace = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    for profile, (samples, links, attributes) in zip((inc, slow), profiles, strict=True):
        assert samples == {tuple(f.name for f in frames): [count]
                           for frames, count in stacks(profile.tree)}
        assert links == {(trace, profile.span_id.to_bytes(8, "big"))}
        assert attributes == dict(profile.attributes)
    assert profiles[0][0][("run", "hot_loop")] == [7]
    resource = request.resource_profiles[0].resource.attributes
    assert [(a.key, a.value.string_value) for a in resource] == [("service.name", "dask")]
    scope = request.resource_profiles[0].scope_profiles[0].scope
    assert (scope.name, scope.version) == ("dask_otel_spans", "1.0")


def test_tables_start_with_their_zero_entry():
    request = ExportProfilesServiceRequest.FromString(profiles_request(
        [linked([((MAIN, HOT), 1)], 5, "inc")], {}, ("s", "1"), PACKAGE_SAMPLE_FIELDS))
    d = request.dictionary
    assert d.string_table[0] == ""
    for table in (d.mapping_table, d.location_table, d.function_table, d.link_table,
                  d.attribute_table, d.stack_table):
        assert table[0].ByteSize() == 0


def test_default_sample_layout_is_the_collectors_not_the_packages():
    # (Collector v0.140.0's pdata numbers Sample's values 2; the package, 4: the
    # request sent is built for the Collector, tests/processes/test_jaeger_profiles.py)
    assert SAMPLE_FIELDS["values"] == 2 != PACKAGE_SAMPLE_FIELDS["values"]
    assert SAMPLE_FIELDS["stack_index"] == PACKAGE_SAMPLE_FIELDS["stack_index"]
