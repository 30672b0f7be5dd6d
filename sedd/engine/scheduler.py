"""How the server's engine shares a step's rows between jobs, and how long the queue waits.

A tick steps at most ``budget`` rows that need a forward. ``select`` splits them between the
jobs in flight, max-min fairly (``fair_shares``: the server, so a small job runs beside a big
one) or first come first (``first_come_shares``: offline runs, whose batches then stay in step).
A job's rows are ``RowBlock`` s, each on its own step; a share that ends inside a block splits it,
and neighbours on the same step join again (``merge_adjacent``). ``ticks_until_room`` is what
a 429's ``Retry-After`` is made of. Every function here returns new values and changes none of
its arguments (``admit`` only pops the queue and counts admitted rows, as the tick asks).
"""

from __future__ import annotations

from collections import deque

from sedd.engine.job_state import JobState, RowBlock


def fair_shares(demands: list[int], budget: int) -> list[int]:
    """Max-min fair split of ``budget`` rows between jobs wanting ``demands`` rows (in arrival
    order): every job gets an equal share or all it wants, whichever is less, and what a small
    job leaves goes to the others. A remainder too small to split goes to the earliest jobs."""
    shares = [0] * len(demands)
    left, open_ = budget, [i for i, want in enumerate(demands) if want > 0]
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:
            for i in open_[:left]:
                shares[i] += 1
            break
        for i in open_:
            give = min(each, demands[i] - shares[i])
            shares[i] += give
            left -= give
        open_ = [i for i in open_ if shares[i] < demands[i]]
    return shares


def first_come_shares(demands: list[int], budget: int) -> list[int]:
    """``budget`` rows given in arrival order: each job all it wants while rows are left (the
    offline split: jobs stay in step, so the fewest forwards run)."""
    shares = []
    for want in demands:
        shares.append(min(want, budget))
        budget -= shares[-1]
    return shares


def merge_adjacent(blocks: list[RowBlock]) -> list[RowBlock]:
    """One job's blocks with neighbours on the same step joined (a job whose rows were split
    between ticks catches up into one block again); sorted by row.

    Pure: a joined block is a new ``RowBlock``, the given ones are left as they were, so an
    estimate (``ticks_until_room``) made from them changes nothing in flight."""
    merged: list[RowBlock] = []
    for blk in sorted(blocks, key=lambda b: b.lo):
        last = merged[-1] if merged else None
        if last is not None and last.hi == blk.lo and last.step == blk.step:
            merged[-1] = RowBlock(blk.state, last.lo, blk.hi, blk.step)
        else:
            merged.append(blk)
    return merged


def take_rows(
    blocks: list[RowBlock], rows: int, behind_first: bool
) -> tuple[list[RowBlock], list[RowBlock]]:
    """(``rows`` rows of one job's blocks to step, and every block it has after the split); a
    block is split where the share ends. ``behind_first`` takes the rows furthest behind first,
    so a job on a steady share keeps its rows level and ends after its row-steps over its share;
    else the rows furthest ahead go first, so rows already under way finish and leave."""
    chosen: list[RowBlock] = []
    kept: list[RowBlock] = []
    sign = 1 if behind_first else -1
    for blk in sorted(blocks, key=lambda b: (sign * b.step, b.lo)):
        if rows <= 0:
            kept.append(blk)
        elif blk.rows <= rows:
            chosen.append(blk)
            kept.append(blk)
            rows -= blk.rows
        else:
            head = RowBlock(blk.state, blk.lo, blk.lo + rows, blk.step)
            kept.extend((head, RowBlock(blk.state, blk.lo + rows, blk.hi, blk.step)))
            chosen.append(head)
            rows = 0
    return chosen, kept


def admit(
    waiting: deque[JobState],
    active: list[RowBlock],
    budget: int,
    max_rows_in_flight: int,
    now: float,
    *,
    fair: bool,
) -> list[RowBlock]:
    """Let waiting rows in (popping jobs whose rows have all joined), in arrival order, while
    fewer than ``max_rows_in_flight`` rows and ``budget`` jobs are in flight; the new blocks.
    A ``fair`` engine starts a job with all its rows (its share of each step does the pacing),
    and then lets small waiting jobs (``reserve_rows``) in out of order, up to the reserve;
    otherwise the head joins with as many rows as fit and the rest follow at later boundaries,
    each block on its own step."""
    rows = sum(blk.rows for blk in active)
    jobs = {id(blk.state) for blk in active}
    joined: list[RowBlock] = []
    while waiting and rows < max_rows_in_flight:
        st = waiting[0]
        if id(st) not in jobs and len(jobs) >= budget:
            break
        left = st.job.num_cells - st.admitted
        take = left if fair else min(left, max_rows_in_flight - rows)
        st.started = now if st.started is None else st.started
        joined.append(RowBlock(st, st.admitted, st.admitted + take))
        st.admitted += take
        rows += take
        jobs.add(id(st))
        if st.admitted == st.job.num_cells:
            waiting.popleft()
    if fair:  # a small job passes bigger waiting ones, into the reserve
        reserve = reserve_rows(max_rows_in_flight)
        for st in [st for st in waiting if st.job.num_cells <= reserve and st.admitted == 0]:
            if rows + st.job.num_cells > max_rows_in_flight + reserve or len(jobs) >= budget:
                continue
            st.started = now
            joined.append(RowBlock(st, 0, st.job.num_cells))
            st.admitted = st.job.num_cells
            rows += st.admitted
            jobs.add(id(st))
            waiting.remove(st)
    return joined


def reserve_rows(max_rows_in_flight: int) -> int:
    """Rows in flight beyond ``max_rows_in_flight`` kept for small jobs under fair sharing: a
    job of at most this many rows joins at once, past bigger jobs waiting for room, so a
    1-cell request is not queued behind hours of maximal ones (its share of each tick then
    bounds its latency). An eighth of the cap, at least one row."""
    return max(1, max_rows_in_flight // 8)


def groups_of(active: list[RowBlock]) -> list[list[RowBlock]]:
    """The in-flight blocks of each job (merged), jobs in the order they started."""
    jobs: dict[int, list[RowBlock]] = {}
    for blk in active:
        if not blk.state.done:
            jobs.setdefault(id(blk.state), []).append(blk)
    return [merge_adjacent(blocks) for blocks in jobs.values()]


def _shares(groups: list[list[RowBlock]], budget: int, fair: bool) -> list[int]:
    wants = [sum(blk.rows for blk in blocks if blk.has_work) for blocks in groups]
    return (fair_shares if fair else first_come_shares)(wants, budget)


def select(
    groups: list[list[RowBlock]], budget: int, *, fair: bool
) -> tuple[list[RowBlock], list[RowBlock]]:
    """(The blocks a tick steps, every block in flight after the split): at most ``budget``
    rows that need a forward, shared between the jobs ``fair`` ly (each job's rows furthest
    behind first) or first come first (rows furthest ahead first). Rows with nothing left to
    change cost no forward and always move on."""
    chosen: list[RowBlock] = []
    active: list[RowBlock] = []
    for blocks, share in zip(groups, _shares(groups, budget, fair), strict=True):
        idle = [blk for blk in blocks if not blk.has_work]
        picked, kept = take_rows([blk for blk in blocks if blk.has_work], share, fair)
        chosen.extend(idle + picked)
        active.extend(idle + kept)
    return chosen, active


def ticks_until_room(
    groups: list[list[RowBlock]], budget: int, max_rows_in_flight: int, *, fair: bool
) -> int:
    """Ticks until the jobs in flight leave room for the head of the queue (fewer than
    ``max_rows_in_flight`` rows and ``budget`` jobs), at today's shares.

    A job whose rows stay level (``select`` steps its rows furthest behind first) has
    ``share * k - (row_steps_left - rows)`` rows done after k ticks; rows with nothing left to
    change move on one step a tick. Shares only grow as jobs leave, and a final denoise that
    finds no mask costs no forward, so this errs long, not short.
    """
    jobs: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # share, work, rows, idle
    horizon = 1
    for blocks, share in zip(groups, _shares(groups, budget, fair), strict=True):
        left = [(blk.rows, blk.state.job.total_steps - blk.step) for blk in blocks]
        busy = [blk.has_work for blk in blocks]
        work = sum(r * n for (r, n), b in zip(left, busy, strict=True) if b)
        want = sum(r for (r, _), b in zip(left, busy, strict=True) if b)
        idle = [rn for rn, b in zip(left, busy, strict=True) if not b]
        jobs.append((share, work, want, idle))
        horizon = max(horizon, -(-work // share) if share else 0, *(n for _, n in idle))

    def room_after(k: int) -> bool:
        rows = running = 0
        for share, work, want, idle in jobs:
            done = min(want, max(0, share * k - (work - want))) if share else 0
            left = want - done + sum(r for r, n in idle if n > k)
            rows, running = rows + left, running + (left > 0)
        return rows < max_rows_in_flight and running < budget

    if room_after(0):
        return 1
    if not room_after(horizon):
        return horizon + 1  # jobs without a share this tick wait for one
    lo, hi = 0, horizon  # no room after lo ticks, room after hi: find the first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if room_after(mid) else (mid, hi)
    return hi
