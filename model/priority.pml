/*
 * Priority in the grant order (claim-v1.md §10) as a Promela model for Spin; docs/model.md maps its steps to the
 * code, tests/model/test_model.py runs it in CI beside model/claim.pml.
 *
 * Configuration:
 *   task 0 (L): priority 3, node A, READY from the start            worker 0: node_ids [A], one task at a time
 *   tasks 1, 2 (H): priority 1, node A, created while the run goes  worker 1: node_ids [B]; may die holding S
 *   task 3 (S): priority 1, node B, READY from the start
 * Urgent tasks keep arriving for a while, then stop (the environment creates each H at most once, and each H may
 * be re-queued once by an operator — a burst of urgent work that ends). Worker 1 may die while it holds S: S's
 * lease runs out and S stays a stale claim that no live worker admits (node B is served by nobody any more).
 *
 * A claim (services.picking: _Batch.fill, statements._priority_bound) takes, among the tasks its node_ids admit,
 * READY or a stale claim, one of the best priority there is — the bound over stale claims applies the request's
 * own conditions (its node filter): a stale claim this request could not take back never holds it back.
 *
 * Safety (assertion): no grant of a lower priority while a task of a higher one was claimable by that request.
 * Progress (LTL, weak fairness): starvation freedom — once urgent tasks stop arriving, L is granted and committed,
 * even with S stale forever.
 *
 * Deliberately broken variants (spin -DNAME -a priority.pml):
 *   BROKEN_OLDEST_FIRST          the pick ignores priority: the oldest claimable task (safety must fail);
 *   BROKEN_BOUND_IGNORES_FILTER  the stale-claim bound counts claims the request cannot take (another node's):
 *                                worker 0 holds off L for S forever (progress must fail).
 */

#define NT 4
#define NONE 255
#define L 0
#define S 3

mtype = { ABSENT, READY, CLAIMED, COMMITTED };

mtype state[NT];
byte prio[NT];
bool live[NT];            /* the current claim's lease has not run out */
bool nodeB[NT];
byte requeues;            /* an operator re-queued a committed urgent task (at most once each) */
bool w1dead;

#define CLAIMABLE(t)  (state[t] == READY || (state[t] == CLAIMED && !live[t]))
#define ADMITS(w, t)  ((w == 0 && !nodeB[t]) || (w == 1 && nodeB[t]))
#define STALE(t)      (state[t] == CLAIMED && !live[t])

/* The best priority a claim of worker w may take now: READY or stale, admitted by w; 9 when none. */
inline best_for(w, best) {
  best = 9;
  for (i : 0 .. NT - 1) {
    if
    :: ADMITS(w, i) && CLAIMABLE(i) && prio[i] < best -> best = prio[i]
    :: else -> skip
    fi
  }
}

/* The pick of worker w: a claimable task it admits, of the best priority under the stale-claim bound. */
inline pick(w, t) {
  bound = 9;
  for (i : 0 .. NT - 1) {
    if
#ifdef BROKEN_BOUND_IGNORES_FILTER
    :: STALE(i) && prio[i] < bound -> bound = prio[i]             /* any node's stale claim */
#else
    :: STALE(i) && ADMITS(w, i) && prio[i] < bound -> bound = prio[i]
#endif
    :: else -> skip
    fi
  }
  t = NONE;
  for (i : 0 .. NT - 1) {
    if
#ifdef BROKEN_OLDEST_FIRST
    :: t == NONE && ADMITS(w, i) && CLAIMABLE(i) -> t = i          /* the oldest: task ids in creation order */
#else
    :: ADMITS(w, i) && CLAIMABLE(i) && prio[i] <= bound && (t == NONE || prio[i] < prio[t]) -> t = i
#endif
    :: else -> skip
    fi
  }
  i = 0
}

inline grant(w, t) {
  best_for(w, best);
  assert(prio[t] == best);                   /* no lower priority while a higher one was claimable by it */
  state[t] = CLAIMED; live[t] = true
}

active [2] proctype Worker() {
  byte w = _pid, t = NONE, i, best, bound;
end:
  do
  :: atomic { t == NONE && !(w == 1 && w1dead) -> pick(w, t);
              if
              :: t != NONE -> grant(w, t)
              :: else -> skip
              fi }
  :: atomic { t != NONE && !(w == 1 && w1dead) && state[t] == CLAIMED && live[t] ->
              state[t] = COMMITTED; live[t] = false; t = NONE }
  :: atomic { t != NONE && w == 1 && !w1dead -> w1dead = true; live[t] = false }  /* dies holding its task */
  :: atomic { t != NONE && !(w == 1 && w1dead) && !(state[t] == CLAIMED && live[t]) -> t = NONE }  /* lost it */
  od
}

/* Urgent work that arrives, then stops: each H created once, and re-queued at most once after its commit. */
active proctype Environment() {
end:
  do
  :: atomic { state[1] == ABSENT -> state[1] = READY }
  :: atomic { state[2] == ABSENT -> state[2] = READY }
  :: atomic { state[1] == COMMITTED && !(requeues & 1) -> requeues = requeues | 1; state[1] = READY }
  :: atomic { state[2] == COMMITTED && !(requeues & 2) -> requeues = requeues | 2; state[2] = READY }
  od
}

init {
  atomic {
    state[L] = READY; prio[L] = 3;
    state[1] = ABSENT; prio[1] = 1;
    state[2] = ABSENT; prio[2] = 1;
    state[S] = READY; prio[S] = 1; nodeB[S] = true
  }
}

ltl starvation_free { <> (state[L] == COMMITTED) }
