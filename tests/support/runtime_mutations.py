"""Planted bugs in the two-tier runtime (issue 13 item 13): each must make a test fail.

Every mutation is a small monkeypatch of dasc's real code, named for the bug it plants:

==============================  ===============================================================
``reclaim_commit_before_pack``  the reclamation walk commits a pending demotion (frees its native
                                slot) without ordering later work after the pack (``order_after``)
``maintain_commits_unfinished`` ``maintain`` commits demotions whose pack has not completed (the
                                event query and the cross-rank agreement are skipped)
``side_stream_no_wait``         the side stream no longer waits on the current stream before a pack
``no_staging_protection``       a staged copy-on-write source may be demoted or evicted before its
                                request is locked (``is_staged`` always False)
``agreement_ignored``           the cross-rank agreement's result is ignored: each TP rank commits
                                the demotions complete on its own GPU
==============================  ===============================================================

:func:`apply` plants one (in a test: ``apply(name, monkeypatch.setattr)``; in a spawned rank
process: ``apply(name)``, undone by the returned function). ``tests/runtime/test_mutations.py``
shows each makes the randomized tests fail for their fixed seeds.
"""

from __future__ import annotations

MUTATIONS = ("reclaim_commit_before_pack", "maintain_commits_unfinished", "side_stream_no_wait",
             "no_staging_protection", "agreement_ignored")


def _side_run_without_wait(self, fn):
    from dasc_runtime.demotion import _DoneEvent

    if self.stream is None:
        fn()
        return _DoneEvent()
    with self.streams.stream(self.stream):          # no self.stream.wait_stream(current)
        fn()
        ev = self.streams.new_event()
        ev.record(self.stream)
    return ev


def _patches(name: str) -> list[tuple[object, str, object]]:
    import dasc_runtime.demotion as dem
    import dasc_runtime.tier_operations as tops

    never = lambda component_data, epoch: False  # noqa: E731
    table = {
        "reclaim_commit_before_pack": [(dem, "order_after", lambda event, mode, streams: None)],
        "maintain_commits_unfinished": [(dem.DemotionEngine, "_ready_on_all_ranks",
                                         lambda self, cands: [True] * len(cands))],
        "side_stream_no_wait": [(dem.SideStream, "run", _side_run_without_wait)],
        "no_staging_protection": [(tops, "is_staged", never), (dem, "is_staged", never)],
        "agreement_ignored": [(dem, "agree_all", lambda flags, group=None: list(flags))],
    }
    if name not in table:
        raise KeyError(f"unknown mutation {name!r}; known: {', '.join(MUTATIONS)}")
    return table[name]


def apply(name: str, setattr_fn=None):
    """Plant mutation ``name``. With ``setattr_fn`` (pytest's ``monkeypatch.setattr``) undoing is the
    caller's; without it the patch is applied directly and the returned function undoes it."""
    patches = _patches(name)
    if setattr_fn is not None:
        for obj, attr, value in patches:
            setattr_fn(obj, attr, value)
        return lambda: None
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    for obj, attr, value in patches:
        setattr(obj, attr, value)

    def undo():
        for obj, attr, value in saved:
            setattr(obj, attr, value)
    return undo
