//! Every `bindgen!` of the host lives here: the `inlet:plugin` world as Rust types.

wasmtime::component::bindgen!({
    path: "wit",
    world: "router",
});

pub use inlet::plugin::types;
