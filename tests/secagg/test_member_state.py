"""The member's typed state saved in two ConfigRecord values and loaded back (flwr_fedeval.secagg.member)."""

from __future__ import annotations

import json

import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from flwr_fedeval._compat import context_from_proto, context_to_proto
from flwr_fedeval.secagg.member import MemberLedger, MemberState


def _every_kind() -> MemberState:
    return MemberState(
        key_id="kid",
        seed_a=bytes(range(32)),
        round=7,
        name="node-1",
        secret=b"",
        max_abs_value=0.1 + 0.2,
        members=["node-0", "node-1"],
        member_commitments=[b"\x00h0", b""],
        confirmed=True,
        opened=b"\xffd",
        own_shares=[b"a", b"bb", b"ccc"],
        pdec_attempts=[1, 2],
        used_key_ids=["k0", "kid"],
    )


def test_state_round_trips_through_the_nodes_context():
    """Every field kind (str, bytes, empty bytes, int, float, bool, list of str / bytes / int) comes back equal,
    through Flower's own serialization of the node's Context, as two values."""
    state = _every_kind()
    ctx = Context(
        run_id=1,
        node_id=2,
        node_config={},
        state=RecordDict({"xmk-state": ConfigRecord(state.to_config())}),
        run_config={},
    )
    back = context_from_proto(context_to_proto(ctx))
    assert sorted(back.state["xmk-state"]) == ["blobs", "fields"]
    assert MemberState.from_config(back.state["xmk-state"]) == state
    assert MemberState.from_config(ConfigRecord(MemberState().to_config())) == MemberState()
    assert MemberLedger.from_config(ConfigRecord(MemberLedger(3, 4, 5).to_config())) == MemberLedger(3, 4, 5)


def test_a_missing_field_loads_as_its_default_and_a_foreign_record_is_refused():
    saved = _every_kind().to_config()
    fields = json.loads(saved["fields"])
    del fields["round"]
    back = MemberState.from_config({"fields": json.dumps(fields), "blobs": saved["blobs"]})
    assert back.round == -1 and back.members == ["node-0", "node-1"]
    with pytest.raises(TypeError, match="no field for"):
        MemberState.from_config({"fields": json.dumps({**fields, "extra-field": 1}), "blobs": saved["blobs"]})
    with pytest.raises(TypeError, match="not a saved record"):
        MemberState.from_config({"key-id": "kid"})  # one key per field: another version's layout
    with pytest.raises(TypeError, match="belong to no field"):
        MemberState.from_config({"fields": saved["fields"], "blobs": [*saved["blobs"], b"x"]})
    with pytest.raises(TypeError, match="blobs past"):
        MemberState.from_config({"fields": saved["fields"], "blobs": saved["blobs"][:-1]})
