"""Record SSD rounds on the real pair offline, then replay them to compare fan-out shapes.

`python -m eval.trace record` runs, in one process, the target (transformers
`AutoModelForCausalLM`, bf16, KV in a `DynamicCache`) and the speculator (`SpeculatorEngine`,
async mode, β = 1, geometric fan-out, default budget and tree depth) on HumanEval prompts. Each
round: the engine serves its draft (cache hit, or a just-in-time draft on a miss), builds the next
round's speculation cache (in the real system this overlaps the verify; here it runs before it
and is timed on its own), the target scores [root, d_1..d_D] in one forward and
`sglang_ssd.saguaro.verify` decides (k, t*) from the target's p (greedy: temperature 0 / top-k 1;
sampled: a seeded generator independent of the draft's). Every round is written to
eval/results/trace-<greedy|t0.7>.json: prompt and round index, committed length, draft source,
draft tokens, accept length k, bonus t*, whether (k, t*) was in the cache (hit), and timings.
A prompt stops at an end-of-sequence token or once it has `max_new_tokens` new tokens; the last
round is kept whole, so a prompt may end up to γ tokens past the limit.

`python -m eval.trace from-run RESULTS --out TRACE` makes a greedy trace without recording: the
prompts and the greedy outputs of one configuration (AR-2c by default) of an `eval run` results
file, i.e. SGLang's own serving of the target (`from_run`); it has no recorded rounds.

`python -m eval.trace replay` replaces the target with a script that forces the recorded output:
for each prompt the engine is opened on the prompt, and every round k is the longest prefix of
the engine's draft that matches the recorded continuation and t* the next recorded token. The
engine's own fork/tree/populate decide whether that outcome was pre-speculated, so the cache hit
rate of any fan-out shape, budget B and tree depth D can be measured on the same outputs without
the target. `--draft-runtime` and `--draft-vocab` draft as the speculator's flags of those
names do (default: the server's, `auto` and 65,536 ids; results written before these options
were bf16 torch over every id). The prompts of one trace are replayed as one batch
(`--batch`), which changes batch shapes and hence bf16 rounding relative to the record;
`--batch 1` replays one prompt at a time.

What a replay can and cannot stand in for:
- Greedy traces replay exactly: the greedy target's outcome is a function of the draft and the
  committed tokens alone (accept while d_j equals the target's argmax, bonus the argmax), and the
  committed tokens are the recorded output whatever the draft was, so the scripted outcomes are
  the ones the real target would have produced for the replayed drafts.
- β < 1 cannot be replayed: Saguaro sampling changes the draft's q, and at T > 0 the outcome
  (accept with prob min(1, p(x)/q(x)), bonus from the residual norm(max(p - q, 0))) depends on
  q, so both the recorded outputs and the acceptance would differ; eval measures β < 1 live.
- The T = 0.7 replay is a scripted approximation: the replayed draft is a fresh sample, and the
  script accepts a draft token only when it equals the recorded token. A real target would
  accept a token that differs from the recorded one with prob min(1, p/q) and then continue a
  different (equally distributed) output, and it would draw the bonus from the residual rather
  than take the recorded token. Accept lengths are therefore pessimistic and the hit rate is
  measured on the recorded sequence's outcome distribution, not the exact one.
"""
