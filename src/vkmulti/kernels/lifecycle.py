"""Checkpoint, restore, live migration and checkpoint policy of runtime kernels
(KernelRuntime's methods for issue 16; the mixin KernelRuntime inherits).

API (the contract the failover code builds on):

``runtime.checkpoint(kernel, *, timeout=60.0) -> Checkpoint``
    A consistent snapshot of `kernel` at a step boundary (ordered after its
    submitted steps, before later ones): the control block (address, tenant,
    step, HLC, per-destination sequence numbers) as CONTROL_BLOCK, the inbox
    ring as CUSTOM chunk `INBOX_CHUNK`, each state buffer i as DEVICE_MEMORY
    named ``f"state{i}"``, host messages not yet on the GPU as H2K_QUEUE,
    messages for the host not yet received as K2H_QUEUE, the SPIR-V as
    CUSTOM chunk `SPIRV_CHUNK`; metadata: kernel id and type, steps so far,
    workgroups (grid) and local size (tile), the kernel's HLC, and the spec,
    address, tenant and params in `custom`. Read through the host (it is the
    portable form: storage, another process, another machine).

``runtime.restore(checkpoint, *, device=None, kernel_id=None, into=None, timeout=60.0) -> Kernel``
    Bring a checkpoint back. `into=None`: launch a new kernel (id: the
    checkpoint's unless `kernel_id`; a new address) on `device` (default: the
    coordinator's choice). `into=k`, a Kernel of this runtime (for example one
    whose device was lost): k keeps its object, id and address and is rebuilt
    on `device` (default: its own device if that is still usable, else the
    coordinator's choice) with the checkpoint's state; its old resources are
    freed (waits on a lost device are skipped). Either way the kernel resumes
    with the checkpoint's step count, clock and sequence numbers, and its
    directory entry is rewritten on every device at their next steps.

``runtime.migrate(kernel, device, *, timeout=60.0) -> MigrationResult``
    Live migration (what ``KernelMigrator.migrate_with_checkpoint`` does for a
    runtime kernel): quiesce, move state GPU to GPU, check CRC32 on both GPUs,
    rewire the directory (and so the K2K router), resume. FAILED leaves the
    kernel running where it was.

``runtime.set_checkpoint_policy(policy)`` / ``runtime.checkpoint_policy``
    ``CheckpointPolicy(every_steps=0, critical=(), keep=1, storage=None)``:
    after every `every_steps`-th step of a kernel (every step for the kernel
    ids in `critical`) the runtime captures a checkpoint: a GPU copy into
    host-visible memory queued right behind the step (no host wait), turned
    into a Checkpoint in host memory once it completed (at the next step,
    poll() or latest_checkpoint()). `keep` captures per kernel are kept;
    `storage` also saves each under ``f"{kernel_id}@{step}"``. None: off.

``runtime.latest_checkpoint(kernel) -> Checkpoint | None``
    The newest completed capture of the policy for a kernel (Kernel or id,
    also of a destroyed or lost one), None if there is none.

The Kernel methods of the seed's traits (CheckpointableKernel,
MigratableKernel, HotReloadableKernel) call these.
"""
