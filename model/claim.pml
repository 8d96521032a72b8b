/*
 * The claim.v1 protocol as a Promela model for Spin. docs/model.md maps every step to the function that
 * implements it, and says how to run it; tests/model/test_model.py runs it in CI.
 *
 * Configuration: 3 tasks, 3 workers, 2 epochs.
 *   task 0: node A, lists resource key K     worker 0: node_ids [A]; stages, may be paused past its lease once
 *   task 1: node B, lists K; created later   worker 1: node_ids [B]; may release once
 *   task 2: node A, lists nothing            worker 2: any node; claims in batches of up to 2
 * An operator creates task 1 at some point (workers may already wait) and may cancel one task; on-call may fence
 * once (epoch 1 -> 2, claims paused) and resume; the clock lets a paused worker's lease run out. Each step is one transaction of the service, so it is one atomic step here: the
 * implementation decides on rows it holds locked ("decide under the lock").
 *
 * Safety (assertions): at most one canonical commit per task; a commit is accepted only from the task's latest
 * grant, under the current epoch and cancel generation (and, for a task listing K, with K's newest fence token);
 * at most one task holds K at a time.
 * Progress (LTL, checked with weak fairness): every task ends COMMITTED or CANCELLED — a READY task that a
 * waiting worker may take is granted (wake-ups reach a waiter whose node_ids admit the task), a healthy owner
 * commits.
 *
 * Deliberately broken variants, chosen with -D when the verifier is generated (spin -DNAME -a claim.pml):
 *   BROKEN_NO_GENERATION_CHECK  commit without the claim-generation check (safety must fail);
 *   BROKEN_BATCH_SHARES_KEY     a batch judges K once for all its picks, so it takes two tasks of K (safety);
 *   BROKEN_WAKE_OLDEST          a wake-up goes to the oldest waiter whatever its node_ids (progress must fail);
 *   BROKEN_NO_WAKE_ON_FREE      ending an attempt that held K wakes nobody (progress must fail).
 */

#define NT 3
#define NW 3
#define MAXEPOCH 2
#define NONE 255

mtype = { READY, CLAIMED, COMMITTED, CANCELLED };

mtype state[NT] = READY;
bool created;            /* task 1 exists (tasks 0 and 2 do from the start) */
byte gen[NT];            /* claim_generation */
byte cgen[NT];           /* cancel_generation */
byte tepoch[NT];         /* the epoch the current claim was granted under */
byte owner[NT];          /* the worker of the current claim */
bool live[NT];           /* its lease has not run out */
byte commits[NT];        /* canonical commits (ghost) */
byte ktoken;             /* K's fence token, as the attempt that took the newest: task * 16 + generation */
byte epoch = 1;          /* the namespace's scheduler_epoch */
bool paused;             /* claims paused (a fence pauses, a resume lifts it) */
bool healthy[NW] = true; /* renews in time; a paused worker's lease may run out */
bool waiting[NW];        /* a waiting claim, queued; a wake-up takes it off the queue */

#define HOLDS(t)     (state[t] == CLAIMED && live[t] && tepoch[t] == epoch)
#define CLAIMABLE(t) ((t != 1 || created) && (state[t] == READY || (state[t] == CLAIMED && (!live[t] || tepoch[t] < epoch))))
#define DONE(t)      ((t != 1 || created) && (state[t] == COMMITTED || state[t] == CANCELLED))
#define LISTS_K(t)   (t < 2)
#define KEY_FREE(t)  (!LISTS_K(t) || !HOLDS(1 - t))   /* no other task that lists K holds it */
#define NODE_B(t)    (t == 1)
#define ADMITS(w, t) (w == 2 || (w == 0 && !NODE_B(t)) || (w == 1 && NODE_B(t)))

/* A wake-up for task t: one waiting worker whose node_ids admit it (services.wakeups + waiting.Hub.wake). */
inline wake_for(t) {
  if
#ifndef BROKEN_WAKE_OLDEST
  :: waiting[0] && ADMITS(0, t) -> waiting[0] = false
  :: waiting[1] && ADMITS(1, t) -> waiting[1] = false
  :: waiting[2] && ADMITS(2, t) -> waiting[2] = false
#else
  :: waiting[0] -> waiting[0] = false
  :: !waiting[0] && waiting[1] -> waiting[1] = false
  :: !waiting[0] && !waiting[1] && waiting[2] -> waiting[2] = false
#endif
  :: else -> skip
  fi
}
inline wake_all() {                                             /* a fence or a resume */
  waiting[0] = false; waiting[1] = false; waiting[2] = false
}
inline key_freed() {                                            /* services.wakeups.keys_freed */
#ifndef BROKEN_NO_WAKE_ON_FREE
  if
  :: CLAIMABLE(0) -> wake_for(0)
  :: else -> skip
  fi;
  if
  :: CLAIMABLE(1) -> wake_for(1)
  :: else -> skip
  fi
#else
  skip
#endif
}
inline ended(t) {                                               /* an attempt of t ended: who may use that? */
  if
  :: LISTS_K(t) -> key_freed()
  :: else -> skip
  fi
}

/* A grant of task t to worker w: claim or reclaim; every grant of a task that lists K takes K's next token. */
inline grant(t, w) {
  gen[t]++; state[t] = CLAIMED; owner[t] = w; live[t] = true; tepoch[t] = epoch;
  if
  :: LISTS_K(t) -> ktoken = t * 16 + gen[t]
  :: else -> skip
  fi;
  assert(!(HOLDS(0) && HOLDS(1)))                               /* one holder of K */
}

/* The commit's checks, in the contract's order, on what the transaction holds; ok when accepted. */
inline commit(t, w, mygen, myepoch, mycgen, mytoken, mystaged, ok) {
  ok = (state[t] == CLAIMED && cgen[t] == mycgen && myepoch == epoch && tepoch[t] == epoch
#ifndef BROKEN_NO_GENERATION_CHECK
        && gen[t] == mygen
#endif
        && live[t] && (!LISTS_K(t) || mytoken == ktoken) && mystaged);
  if
  :: ok ->
     assert(owner[t] == w && gen[t] == mygen && cgen[t] == mycgen && epoch == myepoch);  /* the latest grant */
     state[t] = COMMITTED; live[t] = false; commits[t]++;
     assert(commits[t] == 1);                                   /* one canonical commit */
     ended(t)
  :: else -> skip
  fi
}

/* A worker that claims one task at a time (the oldest its node_ids admit and it may take) and commits it. */
active [2] proctype Worker() {
  byte w = _pid, t = NONE, mygen, mycgen, mytoken, myepoch = 1;
  bool ok, staged, may_pause = (w == 0), may_release = (w == 1);
end_idle:
  do
  :: t == NONE ->
     atomic {                                                   /* claim-next, waiting */
       if
       :: myepoch != epoch -> myepoch = epoch                   /* FENCED: read the namespace again */
       :: !paused && myepoch == epoch ->                        /* (CLAIMS_PAUSED: it retries once resumed) */
          if
          :: ADMITS(w, 0) && CLAIMABLE(0) && KEY_FREE(0) -> t = 0
          :: else ->
             if
             :: ADMITS(w, 1) && CLAIMABLE(1) && KEY_FREE(1) -> t = 1
             :: else ->
                if
                :: ADMITS(w, 2) && CLAIMABLE(2) -> t = 2
                :: else -> waiting[w] = true                    /* nothing: tried and queued in one step */
                fi
             fi
          fi;
          if
          :: t != NONE -> grant(t, w); mygen = gen[t]; mycgen = cgen[t]; mytoken = ktoken
          :: else -> skip
          fi
       fi
     }
end_wait:
     !waiting[w]
  :: t != NONE && may_pause ->                                  /* the stale-worker path */
     staged = true;                                             /* stage: isolated, keyed by the attempt */
     may_pause = false; healthy[w] = false;                     /* SIGSTOP: its lease may run out meanwhile */
     healthy[w] = true;                                         /* SIGCONT: it carries on with what it holds */
     if
     :: atomic {                                                /* renew: refused unless current and live */
          if
          :: state[t] == CLAIMED && gen[t] == mygen && cgen[t] == mycgen && tepoch[t] == epoch && live[t] -> skip
          :: else -> t = NONE; mygen = 0; mycgen = 0; mytoken = 0; staged = false
          fi
        }
     :: skip                                                    /* or its commit was already on its way */
     fi
  :: t != NONE && may_release ->
     may_release = false;
     atomic {                                                   /* release: only the current attempt may */
       if
       :: state[t] == CLAIMED && gen[t] == mygen && tepoch[t] == epoch && myepoch == epoch ->
          state[t] = READY; live[t] = false; wake_for(t); ended(t)
       :: else -> skip
       fi;
       t = NONE; mygen = 0; mycgen = 0; mytoken = 0
     }
  :: t != NONE && !may_pause ->                                 /* commit, the result inline (or staged) */
     atomic { staged = true; commit(t, w, mygen, myepoch, mycgen, mytoken, staged, ok);
              t = NONE; mygen = 0; mycgen = 0; mytoken = 0; staged = false; ok = false }
  od
}

/* A worker that claims in batches of up to 2 (claim-v1.md §9: the oldest first, at most one task per key) and
   commits what it got inline; always healthy. */
active proctype Batcher() {
  byte w = 2, myepoch = 1, i, picks;
  byte g[NT], c[NT], k[NT];
  bool got[NT], ok, free[NT];
end_idle:
  do
  :: atomic {
       if
       :: myepoch != epoch -> myepoch = epoch
       :: !paused && myepoch == epoch ->
          for (i : 0 .. NT - 1) { free[i] = KEY_FREE(i) }       /* K judged before any pick ... */
          picks = 0;
          for (i : 0 .. NT - 1) {
            if
#ifdef BROKEN_BATCH_SHARES_KEY
            :: picks < 2 && CLAIMABLE(i) && free[i] ->          /* ... and not again after a pick */
#else
            :: picks < 2 && CLAIMABLE(i) && KEY_FREE(i) ->      /* ... and again: an earlier pick may hold K */
#endif
               grant(i, w); got[i] = true; g[i] = gen[i]; c[i] = cgen[i]; k[i] = ktoken; picks++
            :: else -> skip
            fi
          }
          for (i : 0 .. NT - 1) { free[i] = false }
          if
          :: picks == 0 -> waiting[w] = true
          :: else -> skip
          fi;
          i = 0; picks = 0
       fi
     }
end_wait:
     !waiting[w];
     if
     :: got[0] -> atomic { commit(0, w, g[0], myepoch, c[0], k[0], true, ok); got[0] = false; g[0] = 0; c[0] = 0; k[0] = 0; ok = false }
     :: else -> skip
     fi;
     if
     :: got[1] -> atomic { commit(1, w, g[1], myepoch, c[1], k[1], true, ok); got[1] = false; g[1] = 0; c[1] = 0; k[1] = 0; ok = false }
     :: else -> skip
     fi;
     if
     :: got[2] -> atomic { commit(2, w, g[2], myepoch, c[2], k[2], true, ok); got[2] = false; g[2] = 0; c[2] = 0; k[2] = 0; ok = false }
     :: else -> skip
     fi
  od
}

/* Everything else, one step at a time in any order: an operator creates task 1 (READY: its node's waiters are
   woken) and may cancel one task (cancel_generation + 1, its attempt ends); on-call fences once (pause, epoch + 1:
   every claim granted before it is over) and resumes; the clock lets a paused worker's lease run out — nobody
   writes an expiry, a waiter's timer wakes it (selectors.next_lease_expiry: leases of its nodes, and of the
   holders of keys its tasks list). */
active proctype Environment() {
  bool fenced, resumed, cancelled;
end:
  do
  :: atomic { !created -> created = true; wake_for(1) }
  :: atomic { !fenced && epoch < MAXEPOCH -> fenced = true; epoch++; paused = true; wake_all() }
  :: atomic { fenced && !resumed -> resumed = true; paused = false; wake_all() }
  :: atomic { !cancelled && !DONE(0) -> cancelled = true; state[0] = CANCELLED; cgen[0]++; live[0] = false; ended(0) }
  :: atomic { !cancelled && created && !DONE(1) -> cancelled = true; state[1] = CANCELLED; cgen[1]++; live[1] = false; ended(1) }
  :: atomic { !cancelled && !DONE(2) -> cancelled = true; state[2] = CANCELLED; cgen[2]++; live[2] = false }
  :: atomic { state[0] == CLAIMED && live[0] && !healthy[owner[0]] -> live[0] = false; wake_for(0); ended(0) }
  :: atomic { state[1] == CLAIMED && live[1] && !healthy[owner[1]] -> live[1] = false; wake_for(1); ended(1) }
  :: atomic { state[2] == CLAIMED && live[2] && !healthy[owner[2]] -> live[2] = false; wake_for(2) }
  od
}

ltl progress { <> (DONE(0) && DONE(1) && DONE(2)) }
