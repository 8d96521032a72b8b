// The worker flow against a live server, through the generated types only:
//   claim-next → release → claim-next (a second attempt) → commit it with the result inline →
//   the first attempt's commit, late: refused 409 FENCED.
// node dist/flow.js <base-url> <worker-token> <owner-id> <namespace>  → one JSON line with what was answered.
import { controlPlane, digest } from "./client.js";
import type { components } from "./schema.js";

type Claim = components["schemas"]["ClaimOut"];

async function main(): Promise<void> {
  const [baseUrl, token, owner, namespace] = process.argv.slice(2);
  if (!baseUrl || !token || !owner || !namespace) throw new Error("usage: flow.js <url> <token> <owner> <namespace>");
  const cp = controlPlane(baseUrl, token);

  const claimNext = async (): Promise<Claim> => {
    const { data, error, response } = await cp.POST("/api/v1/claims", {
      body: { owner_id: owner, scheduler_epoch: 1, ttl_seconds: 30, namespace, wait_seconds: 0 },
    });
    if (response.status !== 200 || !data || error) throw new Error(`claim-next answered ${response.status}`);
    if ("decided_by" in data) throw new Error("expected claim.v1 to decide");
    return data; // narrowed: not legacy's decision, so the core's claim
  };
  const commit = (claim: Claim, result: unknown) =>
    cp.POST("/api/v1/tasks/{task_id}/commit", {
      params: { path: { task_id: claim.task_id } },
      body: {
        attempt_id: claim.attempt_id,
        scheduler_epoch: claim.scheduler_epoch,
        claim_generation: claim.claim_generation,
        observed_cancel_generation: claim.cancel_generation,
        input_digest: claim.input_digest,
        result_digest: digest(result),
        result,
      },
    });

  const first = await claimNext();
  const released = await cp.POST("/api/v1/tasks/{task_id}/release", {
    params: { path: { task_id: first.task_id } },
    body: {
      attempt_id: first.attempt_id,
      claim_generation: first.claim_generation,
      owner_id: owner,
      scheduler_epoch: first.scheduler_epoch,
    },
  });
  const second = await claimNext();
  const committed = await commit(second, { by: "second" });
  const late = await commit(first, { by: "first" });
  const refusal = late.error && "reason" in late.error ? late.error : undefined;
  console.log(
    JSON.stringify({
      task_id: second.task_id,
      released: released.response.status,
      committed: committed.response.status,
      staged_result_id: committed.data && "staged_result_id" in committed.data ? committed.data.staged_result_id : null,
      late: late.response.status,
      late_outcome: refusal?.outcome ?? null,
      late_reason: refusal?.reason ?? null,
    }),
  );
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
