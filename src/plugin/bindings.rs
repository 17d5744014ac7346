//! Every `bindgen!` of the host lives here: the `inlet:plugin` world as Rust types.
//! Exports are async: a call runs on a fiber that the host can abandon at its
//! wall-clock backstop (see the module doc of `plugin`).

wasmtime::component::bindgen!({
    path: "wit",
    world: "router",
    exports: { default: async },
});

pub use inlet::plugin::types;
