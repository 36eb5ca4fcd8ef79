//! What more than one benchmark program needs: the numbers they print (`stats`) and a torch
//! job's store traffic (`torch`, the bench's `--history` and the soak). Each program is a
//! binary of its own folder; its workers are in `workers/`.

pub mod stats;
pub mod torch;
