//! Exports `inlet:plugin/handler@0.2.0`; the host supports 0.1.0 and must refuse it
//! at load, naming both versions.

wit_bindgen::generate!({ path: "wit", world: "router" });

struct Plugin;

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(data: Vec<u8>) -> String {
        String::from_utf8_lossy(&data).into_owned()
    }
}

export!(Plugin);
