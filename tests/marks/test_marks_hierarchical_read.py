"""`read(scope)` is hierarchical on both backends, as the markspace package's read (§7.5,
§8.2, P23, P26): the marks of the scope and of every scope nested under it, never of a
sibling whose name merely starts the same ("research2"), with the filters, supersession,
warnings, min_strength, ordering and max_tokens of any read, and the READ scope's
visibility for every mark returned. `read_exact` reads the one scope (the guard's view).

Cheap on purpose: one space per backend, a fixed clock, a dozen writes.
"""

from __future__ import annotations

import pytest

from agentpost.marks.core import (
    Action,
    Agent,
    DecayConfig,
    Intent,
    MarkType,
    Observation,
    Scope,
    ScopeVisibility,
    Warning,
)
from marks_backends import T0, SpaceFactory

DECAY = DecayConfig(observation_half_life=60.0, warning_half_life=60.0, intent_ttl=100.0)
SCOPES = [
    Scope(name="research", decay=DECAY),
    Scope(name="research2", decay=DECAY),
    Scope(name="hr", decay=DECAY, visibility=ScopeVisibility.PROTECTED),
    Scope(name="legal", decay=DECAY, visibility=ScopeVisibility.CLASSIFIED),
    Scope(name="hr/secret", decay=DECAY, visibility=ScopeVisibility.CLASSIFIED),
    Scope(name="desk", decay=DECAY),
    Scope(name="desk/vault", decay=DECAY, visibility=ScopeVisibility.CLASSIFIED),
    Scope(name="desk/notes", decay=DECAY, visibility=ScopeVisibility.PROTECTED),
]
ALL = [t.value for t in MarkType]
WRITER = Agent(name="writer", scopes={s.name: ALL for s in SCOPES})
STRANGER = Agent(name="stranger", scopes={})
HR_READER = Agent(name="hr-reader", scopes={}, read_scopes=("hr",))
CASE_READER = Agent(name="case-reader", scopes={}, read_scopes=("legal/case",))
VAULT_READER = Agent(name="vault-reader", scopes={}, read_scopes=("desk/vault",))
NOTES_READER = Agent(name="notes-reader", scopes={}, read_scopes=("desk/notes",))


@pytest.fixture
def space(new_space: SpaceFactory):
    """A fresh space of the test's backend with SCOPES, at T0."""
    return new_space(SCOPES, T0)


def _obs(scope: str, topic: str, strength: float, **fields) -> Observation:
    return Observation(scope=scope, topic=topic, content={"at": scope},
                       initial_strength=strength, confidence=1.0, **fields)


def _ids(marks) -> list:
    return [m.id for m in marks]


def test_read_includes_nested_scopes_not_siblings_with_filters_p23(space) -> None:
    """P23/§7.5: read("research") returns research, research/a and research/a/b marks,
    strongest first; never research2's. Topic, resource and mark_type filters, supersession,
    warnings and max_tokens apply across the tree; read("research/a") leaves the parent
    out; read_exact reads the one scope."""
    w = WRITER
    top = space.write(w, _obs("research", "t", 0.9))
    warned = space.write(w, _obs("research/a", "t", 0.5))
    space.write(w, Warning(scope="research/a", topic="w", invalidates=warned,
                           initial_strength=1.0))
    other_topic = space.write(w, _obs("research/a", "u", 0.8))
    old = space.write(w, _obs("research/a/b", "t", 0.7))
    deep = space.write(w, _obs("research/a/b", "t", 0.6, supersedes=old))
    space.write(w, _obs("research2", "t", 1.0))
    intent = space.write(w, Intent(scope="research", resource="r", action="book",
                                   confidence=0.9))
    action = space.write(w, Action(scope="research/a", resource="r", action="did"))

    assert _ids(space.read("research", topic="t")) == [top, deep]
    assert _ids(space.read("research/a", topic="t")) == [deep]
    assert _ids(space.read_exact("research", topic="t")) == [top]
    assert set(_ids(space.read("research", resource="r"))) == {intent, action}
    assert _ids(space.read("research", resource="r", mark_type=MarkType.ACTION)) == [action]
    assert _ids(space.read("research", mark_type=MarkType.OBSERVATION, min_strength=0.75)) == [
        top, other_topic]
    everything = space.read("research")
    assert {m.scope for m in everything} == {"research", "research/a", "research/a/b"}
    strengths = [space.strength_of(m) for m in everything]
    assert strengths == sorted(strengths, reverse=True) and all(s > 0 for s in strengths)
    assert _ids(space.read("research", max_tokens=1)) == []
    first = space.read("research", max_tokens=len(str(everything[0].model_dump())) // 4)
    assert _ids(first) == [everything[0].id]
    # §8.2 and the package: at 0 the fully warned mark (strength 0) is returned too, the
    # superseded one never (§10); any threshold > 0 leaves both out
    assert set(_ids(space.read("research", topic="t", min_strength=0.0))) == {top, warned, deep}
    assert set(_ids(space.read("research", topic="t", min_strength=1e-12))) == {top, deep}


def test_nested_read_takes_the_read_scopes_visibility_p21_p22(space) -> None:
    """P21/P22/P26 as the package applies them to a hierarchical read: the READ scope's
    visibility and the reader's authorization for the read scope decide, for every mark of
    the tree: projected for a stranger under PROTECTED "hr", full for a reader of "hr",
    nothing under CLASSIFIED "legal" unless the reader may read "legal" itself."""
    pay = space.write(WRITER, _obs("hr/pay", "salary", 0.9))
    case = space.write(WRITER, _obs("legal/case", "x", 0.9))

    projected = space.read("hr", reader=STRANGER)
    assert _ids(projected) == [pay] and projected[0].projected
    assert projected[0].content is None
    full = space.read("hr", reader=HR_READER)
    assert _ids(full) == [pay] and not full[0].projected
    assert full[0].content == {"at": "hr/pay"}
    assert space.read("legal", reader=STRANGER) == []
    assert space.read("legal", reader=CASE_READER) == []  # authorized below, not for "legal"
    assert _ids(space.read("legal/case", reader=CASE_READER)) == [case]
    assert _ids(space.read("legal")) == [case]  # infrastructure sees everything


def test_a_classified_child_stays_hidden_from_a_reader_of_its_open_parent_p22_p25(
    space,
) -> None:
    """P22/P25 (the spec over the package, which returns it in full): a CLASSIFIED scope
    with its own definition under an OPEN parent keeps its marks (and those of scopes it
    governs) from a reader of the parent not authorized for it, and is not projected
    either; under a PROTECTED parent it is left out, not projected (the stricter rule).
    An authorized reader and infrastructure see them in full."""
    desk = space.write(WRITER, _obs("desk", "t", 0.9))
    vault = space.write(WRITER, _obs("desk/vault", "t", 0.8))
    deep = space.write(WRITER, _obs("desk/vault/deep", "t", 0.7))
    pay = space.write(WRITER, _obs("hr/pay", "t", 0.9))
    space.write(WRITER, _obs("hr/secret", "t", 0.8))

    assert _ids(space.read("desk", reader=STRANGER)) == [desk]
    assert _ids(space.read("desk", topic="t", reader=STRANGER, max_tokens=10_000)) == [desk]
    authorized = space.read("desk", reader=VAULT_READER)
    assert _ids(authorized) == [desk, vault, deep]
    assert all(not m.projected and m.content is not None for m in authorized)
    assert _ids(space.read("desk")) == [desk, vault, deep]
    assert space.read("desk/vault", reader=STRANGER) == []
    assert _ids(space.read("hr", reader=STRANGER)) == [pay]


def test_a_protected_child_is_projected_for_a_reader_of_its_open_parent_p22_p24(
    space,
) -> None:
    """P22/P24: a PROTECTED scope with its own definition under an OPEN parent is projected
    (structure kept, content emptied) for a reader of the parent not authorized for it; in
    full for its authorized reader and for infrastructure; the parent's own marks stay
    full for everyone."""
    desk = space.write(WRITER, _obs("desk", "t", 0.9))
    note = space.write(WRITER, _obs("desk/notes", "t", 0.8))

    seen = space.read("desk", reader=STRANGER)
    assert _ids(seen) == [desk, note]
    assert not seen[0].projected and seen[0].content == {"at": "desk"}
    assert seen[1].projected and seen[1].content is None and seen[1].topic == "t"
    full = space.read("desk", reader=NOTES_READER)
    assert _ids(full) == [desk, note] and full[1].content == {"at": "desk/notes"}
    assert not full[1].projected
    assert space.read("desk")[1].content == {"at": "desk/notes"}


def test_a_limited_read_is_the_first_marks_of_the_full_read(space) -> None:
    """`limit` (ours: the agent tools' read_marks asks for at most 20) returns exactly the
    first `limit` marks the unlimited read returns, on both backends, whatever the reader
    may see (hidden marks are skipped before counting, projected ones counted as
    projected), with ties in strength ordered by write order; a bad limit is refused."""
    from agentpost.marks.core import InvalidArgument

    for i in range(6):
        space.write(WRITER, _obs("desk", f"t{i % 2}", 0.9 - 0.1 * (i // 2)))
        space.write(WRITER, _obs("desk/vault", "t", 0.85 - 0.1 * i))
        space.write(WRITER, _obs("desk/notes", "t", 0.9 - 0.1 * (i // 2)))
    for reader in (None, STRANGER, VAULT_READER, NOTES_READER):
        full = space.read("desk", reader=reader)
        for limit in (0, 1, 2, 5, 7, len(full), len(full) + 3):
            limited = space.read("desk", reader=reader, limit=limit)
            assert _ids(limited) == _ids(full[:limit]), (reader, limit)
            assert [m.projected for m in limited] == [m.projected for m in full[:limit]]
        assert _ids(space.read("desk", topic="t1", reader=reader, limit=2)) == \
            _ids(space.read("desk", topic="t1", reader=reader)[:2])
        assert _ids(space.read_exact("desk", reader=reader, limit=3)) == \
            _ids(space.read_exact("desk", reader=reader)[:3])
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidArgument, match="limit"):
            space.read("desk", limit=bad)
