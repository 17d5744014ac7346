//! Memory for shadow candidates that stays mapped: their linear memories and fiber
//! stacks come from regions the process maps once and then reuses, and old contents
//! are cleared with plain stores by the thread that reuses them.
//!
//! Why: a candidate whose instances grow and are replaced (one that hoards memory
//! until its cap traps it, say) would otherwise make the process map, fault in and
//! unmap memory for every instance. Those costs do not stay on the shadow thread:
//! every unmap interrupts each core running the process to flush its TLB, and every
//! change to the memory map takes the process's map lock for writing, which stalls
//! the serving threads' own page faults and allocations. The shadow's CPU budget
//! reads its own thread's clock and cannot see any of it. With regions reused, a
//! candidate costs the kernel nothing once its regions are warm: growing a memory
//! is a length update, and clearing is the shadow thread's own CPU time, which its
//! budget counts.
//!
//! The candidate engine ([`configure`]) compiles every memory access with an
//! explicit bounds check against the memory's current length (no reservation, no
//! guard region, memories that may move), so a region that is readable and
//! writable beyond the guest's length still gives the guest exactly its length:
//! an access past it traps as it would anywhere else.
//!
//! Idle regions keep their touched pages; what they keep is bounded (in bytes for
//! memories, in count for stacks), and a region beyond the bound is unmapped.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use wasmtime::{LinearMemory, MemoryCreator, MemoryType, StackCreator, StackMemory};

/// Size of a new linear-memory region: the largest instance cap of any candidate
/// loaded so far (see [`reserve`]). Mapped without reserving swap, so only touched
/// pages cost memory.
static REGION_BYTES: AtomicUsize = AtomicUsize::new(64 << 20);
/// Touched bytes idle memory regions may keep, all together.
static KEEP_BYTES: AtomicUsize = AtomicUsize::new(256 << 20);
/// Idle fiber stacks kept.
const KEEP_STACKS: usize = 32;

/// Makes new memory regions large enough for an instance capped at `bytes`.
pub fn reserve(bytes: usize) {
    let wanted = bytes.max(1 << 16).next_multiple_of(page_size());
    if REGION_BYTES.fetch_max(wanted, Ordering::Relaxed) < wanted {
        // Idle regions of the old size would never be taken again: unmap them.
        let idle = std::mem::replace(&mut *MEMORIES.lock().expect("resident pool lock"), Pool::new());
        drop(idle);
    }
}

/// Bounds the touched bytes idle memory regions keep (the shadow memory budget).
pub fn keep_at_most(bytes: usize) {
    KEEP_BYTES.store(bytes, Ordering::Relaxed);
}

/// Sets up a candidate engine's configuration: explicit bounds checks against the
/// current length, data segments copied rather than mapped, and memories and
/// stacks from the pools of this module.
pub fn configure(config: &mut wasmtime::Config) {
    config.memory_reservation(0);
    config.memory_reservation_for_growth(0);
    config.memory_guard_size(0);
    config.guard_before_linear_memory(false);
    config.memory_may_move(true);
    config.memory_init_cow(false);
    config.with_host_memory(Arc::new(ResidentMemories));
    config.with_host_stack(Arc::new(ResidentStacks));
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// One mapping, readable and writable except for `guard` bytes at its start.
struct Region {
    base: NonNull<u8>,
    len: usize,
    guard: usize,
    /// Bytes from the end of the guard that may hold an earlier user's contents.
    dirty: usize,
}

// SAFETY: a region is plain memory owned by whoever holds the `Region`; nothing in
// it is tied to a thread.
unsafe impl Send for Region {}
// SAFETY: as above; shared access only reads the pointer and lengths.
unsafe impl Sync for Region {}

impl Region {
    fn map(len: usize, guard: usize) -> std::io::Result<Region> {
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks;
        // nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let region =
            Region { base: NonNull::new(base.cast()).expect("mmap gives a non-null address"), len, guard, dirty: 0 };
        // SAFETY: the first `guard` bytes lie inside the mapping just made.
        if guard > 0 && unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(region)
    }

    /// The usable bytes' start (after the guard).
    fn start(&self) -> *mut u8 {
        // SAFETY: `guard < len`, so this stays inside the mapping.
        unsafe { self.base.as_ptr().add(self.guard) }
    }

    /// Zeroes the part of `range` (offsets from [`Region::start`]) that may hold old
    /// contents; the rest is zero already (never touched since it was mapped).
    fn clear(&mut self, range: Range<usize>) {
        let end = range.end.min(self.dirty);
        if range.start < end {
            // SAFETY: `start..end` lies within the usable bytes (`dirty` never passes
            // them), and whoever calls this owns the region exclusively.
            unsafe { std::ptr::write_bytes(self.start().add(range.start), 0, end - range.start) };
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Region::map` with this length and is
        // dropped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Idle regions of one kind.
struct Pool {
    idle: Vec<Region>,
    /// Sum of the idle regions' `dirty` bytes.
    kept: usize,
}

impl Pool {
    const fn new() -> Pool {
        Pool { idle: Vec::new(), kept: 0 }
    }

    /// An idle region of exactly `len` bytes with `guard`, else a new one.
    fn take(pool: &Mutex<Pool>, len: usize, guard: usize) -> std::io::Result<Region> {
        let reused = {
            let mut p = pool.lock().expect("resident pool lock");
            let found = p.idle.iter().rposition(|r| r.len == len && r.guard == guard);
            found.map(|i| {
                let r = p.idle.swap_remove(i);
                p.kept -= r.dirty;
                r
            })
        };
        match reused {
            Some(region) => Ok(region),
            None => Region::map(len, guard),
        }
    }

    /// Keeps a region for reuse unless that would pass `max_bytes` of touched pages
    /// or `max_count` regions; otherwise it is unmapped (outside the lock).
    fn give(pool: &Mutex<Pool>, region: Region, max_bytes: usize, max_count: usize) {
        let mut p = pool.lock().expect("resident pool lock");
        if p.idle.len() < max_count && p.kept + region.dirty <= max_bytes {
            p.kept += region.dirty;
            p.idle.push(region);
            return;
        }
        drop(p);
        drop(region);
    }
}

static MEMORIES: Mutex<Pool> = Mutex::new(Pool::new());
static STACKS: Mutex<Pool> = Mutex::new(Pool::new());

/// Hands wasmtime linear memories from [`MEMORIES`].
struct ResidentMemories;

// SAFETY: every memory it returns is a page-aligned region of its own, zero up to its
// length, that only the returned object uses until it is dropped. It has no guard
// region, which is sound because the candidate engine is configured (`configure`)
// with no guard size and no reservation, so compiled code checks every access
// against the current length.
unsafe impl MemoryCreator for ResidentMemories {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        _reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        if guard_size_in_bytes != 0 {
            return Err(format!("resident memories have no guard region (asked for {guard_size_in_bytes} bytes)"));
        }
        let len = REGION_BYTES.load(Ordering::Relaxed);
        let capacity = maximum.unwrap_or(usize::MAX).min(len);
        if minimum > capacity {
            return Err(format!("a memory of {minimum} bytes does not fit a region of {len}"));
        }
        let mut region = Pool::take(&MEMORIES, len, 0).map_err(|e| format!("cannot map plugin memory: {e}"))?;
        region.clear(0..minimum);
        Ok(Box::new(ResidentMemory { region: Some(region), size: minimum, capacity }))
    }
}

struct ResidentMemory {
    /// Always `Some` until dropped.
    region: Option<Region>,
    size: usize,
    capacity: usize,
}

// SAFETY: `as_ptr` is the region's start, page aligned, valid for `byte_capacity`
// bytes and never moved; `grow_to` only hands out zeroed bytes within it.
unsafe impl LinearMemory for ResidentMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.capacity {
            return Err(wasmtime::Error::msg(format!(
                "memory of {new_size} bytes asked for, regions hold {}",
                self.capacity
            )));
        }
        if new_size > self.size {
            self.region.as_mut().expect("a live memory has its region").clear(self.size..new_size);
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.region.as_ref().expect("a live memory has its region").start()
    }
}

impl Drop for ResidentMemory {
    fn drop(&mut self) {
        if let Some(mut region) = self.region.take() {
            region.dirty = region.dirty.max(self.size);
            Pool::give(&MEMORIES, region, KEEP_BYTES.load(Ordering::Relaxed), usize::MAX);
        }
    }
}

/// Hands wasmtime fiber stacks from [`STACKS`].
struct ResidentStacks;

// SAFETY: every stack is a page-aligned region of its own with a guard page below it
// (stacks grow down), used only by the returned object until it is dropped.
unsafe impl StackCreator for ResidentStacks {
    fn new_stack(&self, size: usize, zeroed: bool) -> Result<Box<dyn StackMemory>, wasmtime::Error> {
        let page = page_size();
        let size = size.next_multiple_of(page);
        let mut region = Pool::take(&STACKS, page + size, page).map_err(wasmtime::Error::msg)?;
        if zeroed {
            region.clear(0..size);
        }
        region.dirty = size;
        Ok(Box::new(ResidentStack { region: Some(region), size }))
    }
}

struct ResidentStack {
    region: Option<Region>,
    size: usize,
}

impl ResidentStack {
    fn region(&self) -> &Region {
        self.region.as_ref().expect("a live stack has its region")
    }
}

// SAFETY: top, range and guard describe the one region this object owns.
unsafe impl StackMemory for ResidentStack {
    fn top(&self) -> *mut u8 {
        // SAFETY: `size` usable bytes follow the start.
        unsafe { self.region().start().add(self.size) }
    }

    fn range(&self) -> Range<usize> {
        let start = self.region().start() as usize;
        start..start + self.size
    }

    fn guard_range(&self) -> Range<*mut u8> {
        let region = self.region();
        region.base.as_ptr()..region.start()
    }
}

impl Drop for ResidentStack {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            Pool::give(&STACKS, region, usize::MAX, KEEP_STACKS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory of one page that can grow, and a byte store and load at any address.
    const MEMORY: &str = r#"
        (component
          (core module $m
            (memory (export "memory") 1)
            (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0)))
            (func (export "put") (param i32 i32) (i32.store8 (local.get 0) (local.get 1)))
            (func (export "get") (param i32) (result i32) (i32.load8_u (local.get 0))))
          (core instance $i (instantiate $m))
          (func (export "grow") (param "pages" u32) (result s32) (canon lift (core func $i "grow")))
          (func (export "put") (param "at" u32) (param "byte" u32) (canon lift (core func $i "put")))
          (func (export "get") (param "at" u32) (result u32) (canon lift (core func $i "get"))))
    "#;

    /// A fresh instance of [`MEMORY`] on a candidate engine, and its store.
    fn instance() -> (wasmtime::Store<()>, wasmtime::component::Instance) {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        configure(&mut config);
        let engine = wasmtime::Engine::new(&config).expect("the candidate configuration is valid");
        let bytes = wat::parse_str(MEMORY).expect("valid component text");
        let component = wasmtime::component::Component::new(&engine, bytes).expect("compiles");
        let mut store = wasmtime::Store::new(&engine, ());
        let instance =
            wasmtime::component::Linker::<()>::new(&engine).instantiate(&mut store, &component).expect("instantiates");
        (store, instance)
    }

    #[test]
    fn every_new_instance_finds_its_memory_zeroed_and_traps_past_its_length_although_its_region_goes_on() {
        for round in 0..3 {
            let (mut store, instance) = instance();
            let grow = instance.get_typed_func::<(u32,), (i32,)>(&mut store, "grow").unwrap();
            let put = instance.get_typed_func::<(u32, u32), ()>(&mut store, "put").unwrap();
            let get = instance.get_typed_func::<(u32,), (u32,)>(&mut store, "get").unwrap();
            let (was,) = grow.call(&mut store, (3,)).unwrap();
            assert_eq!(was, 1, "round {round}: the memory starts at one page");
            for at in [0, 65_535, 65_536, 4 * 65_536 - 1] {
                let (seen,) = get.call(&mut store, (at,)).unwrap();
                assert_eq!(seen, 0, "round {round}: byte {at} left over from an earlier instance");
                put.call(&mut store, (at, 0xab)).unwrap();
            }
            let past = get.call(&mut store, (4 * 65_536,)).expect_err("one byte past the length");
            assert_eq!(past.downcast_ref::<wasmtime::Trap>(), Some(&wasmtime::Trap::MemoryOutOfBounds), "{past:#}");
        }
    }

    #[test]
    fn a_region_given_back_is_the_one_taken_next_and_clearing_zeroes_what_was_written() {
        static LOCAL: Mutex<Pool> = Mutex::new(Pool::new());
        let len = 1 << 20;
        let mut region = Pool::take(&LOCAL, len, 0).expect("maps");
        let base = region.base;
        // SAFETY: the first 8192 bytes of the region this test owns.
        unsafe { std::ptr::write_bytes(region.start(), 0xab, 8192) };
        region.dirty = 8192;
        Pool::give(&LOCAL, region, usize::MAX, usize::MAX);
        assert_eq!(LOCAL.lock().unwrap().kept, 8192);
        let mut again = Pool::take(&LOCAL, len, 0).expect("reuses");
        assert_eq!(again.base, base, "the idle region is reused, not a new one mapped");
        assert_eq!(LOCAL.lock().unwrap().kept, 0);
        again.clear(4096..len);
        // SAFETY: the region's usable bytes, owned by this test.
        let bytes = unsafe { std::slice::from_raw_parts(again.start(), 8192) };
        assert!(bytes[..4096].iter().all(|&b| b == 0xab), "outside the range asked for, nothing is cleared");
        assert!(bytes[4096..].iter().all(|&b| b == 0), "within it, what was written is gone");
        Pool::give(&LOCAL, again, 0, usize::MAX);
        assert!(LOCAL.lock().unwrap().idle.is_empty(), "past the bytes kept, a region is unmapped, not kept");
    }

    #[test]
    fn a_memory_past_its_region_is_refused_and_the_guest_sees_a_failed_grow() {
        let (mut store, instance) = instance();
        let grow = instance.get_typed_func::<(u32,), (i32,)>(&mut store, "grow").unwrap();
        let pages = (REGION_BYTES.load(Ordering::Relaxed) / 65_536) as u32;
        let (answer,) = grow.call(&mut store, (pages,)).unwrap();
        assert_eq!(answer, -1, "one page plus a region's worth does not fit the region");
    }
}
