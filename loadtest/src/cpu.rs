//! The CPUs the harness runs on: which it may use, pinning a thread (and those it creates) to some, and a
//! thread's own CPU time, what the engine's and the floor's costs are measured in.

use std::time::Duration;

/// The CPUs this process may run on.
pub(crate) fn allowed_cpus() -> Result<Vec<usize>, String> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let allowed =
        sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(|e| format!("cannot read the CPU affinity: {e}"))?;
    Ok((0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect())
}

/// Pins the calling thread, and the threads it creates from then on, to `cpus`.
pub(crate) fn pin_to(cpus: &[usize]) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu).map_err(|e| format!("CPU {cpu}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("cannot pin to CPUs {cpus:?}: {e}"))
}

/// A `taskset` CPU list: `1`, `0,2`, `2-3`.
pub(crate) fn cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("{list:?}: expected a CPU list such as 1, 0,2 or 2-3");
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) =
            (first.trim().parse().map_err(|_| bad())?, last.trim().parse().map_err(|_| bad())?);
        cpus.extend(first..=last);
    }
    if cpus.is_empty() { Err(bad()) } else { Ok(cpus) }
}

/// The calling thread's CPU time so far (the kernel's count, in nanoseconds).
pub(crate) fn thread_cpu() -> Result<Duration, String> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_err(|e| format!("the thread's CPU clock: {e}"))?;
    Ok(Duration::from(now))
}

#[cfg(test)]
mod tests {
    use super::cpu_list;

    #[test]
    fn cpu_lists_parse_like_taskset() {
        assert_eq!(cpu_list("1"), Ok(vec![1]));
        assert_eq!(cpu_list("0,2-4"), Ok(vec![0, 2, 3, 4]));
        assert!(cpu_list("one").unwrap_err().contains("CPU list"));
    }
}
