/*
 * Trace validation (issue 39, 2): a recorded history replayed against the claim protocol's rules, as etcd's raft
 * and CCF check their implementations' traces against their specifications. tests/support/trace.py writes the
 * events (events.txt: one line per recorded decision, in the order of the clock each decision was made on),
 * generates the verifier with NT tasks and NS namespaces (spin -DNT=… -DNS=… -a), and runs it: the one path
 * through the events. Each event must be a step the rules allow from the state the earlier events left, judged on
 * the clock the event recorded; the first one they do not allow fails an assertion ("REJECT <index>").
 *
 * The rules are model/claim.pml's, per task (its state, generation, the epoch of its current grant, its lease's
 * end) and per namespace (its epoch):
 *   GRANT    (claimed, reclaimed): generation + 1, under the namespace's epoch, of a READY task or of a claim whose
 *            lease ran out (its end <= the grant's clock) or whose epoch a fence ended; a lease that ends after it.
 *   RENEW    the current generation, under the current epoch, its lease still live at the renew's clock.
 *   COMMIT   (result_committed) the same checks as a renew; the task is COMMITTED.
 *   RELEASE  the current generation under the current epoch: the task is READY again.
 *   FENCE    (epoch_fence, failover_fence) the namespace's epoch moves up.
 *   CANCEL, REQUEUE, and a task created or unblocked: the operator's and the dependencies' moves.
 *
 * The events are read by C code into memory, and the per-task state is hidden (not part of the state vector): the
 * replay is one deterministic path, so nothing is stored per state but the event counter.
 */

#define READY     0
#define CLAIMED   1
#define COMMITTED 2
#define CANCELLED 3

#define K_GRANT   1
#define K_RENEW   2
#define K_COMMIT  3
#define K_RELEASE 4
#define K_FENCE   5
#define K_CANCEL  6
#define K_REQUEUE 7
#define K_READY   8

c_decl {
  int *EV;      /* 7 numbers an event: kind, task, namespace, generation, epoch, at, lease */
  int NEV;
  void load_events(void) {
    FILE *f = fopen("events.txt", "r");
    int n, j;
    if (!f || fscanf(f, "%d", &NEV) != 1) { printf("NO EVENTS\n"); exit(2); }
    EV = (int *) malloc(sizeof(int) * 7 * (NEV + 1));
    for (n = 0; n < NEV * 7; n++) {
      if (fscanf(f, "%d", &j) != 1) { printf("SHORT EVENTS\n"); exit(2); }
      EV[n] = j;
    }
    fclose(f);
  }
}

int ne;                       /* events */
int i;                        /* the event replayed now */
hidden byte k;                /* its fields */
hidden int t, n, g, e, at, le;
hidden byte state[NT];
hidden int gen[NT];
hidden int tepoch[NT];
hidden int lease[NT];
hidden byte ns_of[NT];
hidden int epoch[NS];

#define HELD (state[t] == CLAIMED && gen[t] == g && tepoch[t] == epoch[ns_of[t]] && e == epoch[ns_of[t]] && lease[t] > at)

inline reject() {
  c_code { printf("REJECT %d\n", now.i); };
  assert(false)
}

init {
  c_code { load_events(); now.ne = NEV; };
  d_step {
    for (n : 0 .. NS - 1) { epoch[n] = 1 };
    n = 0
  };
  do
  :: i < ne ->
     d_step {
       c_code {
         int *x = EV + 7 * now.i;
         k = x[0]; t = x[1]; n = x[2]; g = x[3]; e = x[4]; at = x[5]; le = x[6];
       };
       if
       :: k == K_FENCE ->
          if
          :: e > epoch[n] -> epoch[n] = e
          :: else -> reject()
          fi
       :: k == K_GRANT ->
          ns_of[t] = n;
          if
          :: (g == gen[t] + 1 && e == epoch[n] && le > at &&
              (state[t] == READY || (state[t] == CLAIMED && (lease[t] <= at || tepoch[t] < epoch[n])))) ->
             state[t] = CLAIMED; gen[t] = g; tepoch[t] = e; lease[t] = le
          :: else -> reject()
          fi
       :: k == K_RENEW ->
          if
          :: HELD -> lease[t] = le
          :: else -> reject()
          fi
       :: k == K_COMMIT ->
          if
          :: HELD -> state[t] = COMMITTED
          :: else -> reject()
          fi
       :: k == K_RELEASE ->
          if
          :: (state[t] == CLAIMED && gen[t] == g && tepoch[t] == epoch[ns_of[t]]) -> state[t] = READY
          :: else -> reject()
          fi
       :: k == K_CANCEL ->
          if
          :: state[t] != COMMITTED -> state[t] = CANCELLED
          :: else -> reject()
          fi
       :: k == K_REQUEUE ->
          if
          :: state[t] == CANCELLED -> state[t] = READY
          :: else -> reject()
          fi
       :: k == K_READY -> ns_of[t] = n
       fi;
       i++
     }
  :: else -> break
  od;
  c_code { printf("ACCEPTED %d\n", now.ne); }
}
