//! Hand-made inputs for the `component` target's corpus (see
//! `examples/seeds.rs`), small enough to read in a hex dump.

/// The header of a component (layer 1, version 0x0d).
const COMPONENT: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// A core module with one memory of one page.
fn module_with_memory() -> Vec<u8> {
    let mut module = vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    // Memory section: one memory, no maximum, one page.
    module.extend_from_slice(&[0x05, 0x03, 0x01, 0x00, 0x01]);
    module
}

fn section(id: u8, contents: &[u8]) -> Vec<u8> {
    assert!(contents.len() < 128, "one-byte LEB128 sizes only");
    [&[id, contents.len() as u8][..], contents].concat()
}

/// A component that holds `module_with_memory` and instantiates it once.
fn component_with_instance() -> Vec<u8> {
    let module = module_with_memory();
    [
        &COMPONENT[..],
        &section(0x01, &module),
        // Core instance section: one instance, instantiate module 0, no args.
        &section(0x02, &[0x01, 0x00, 0x00, 0x00]),
    ]
    .concat()
}

/// Small components, each named: empty, one module instance, and the same
/// nested one level and instantiated twice.
pub fn components() -> Vec<(&'static str, Vec<u8>)> {
    let inner = component_with_instance();
    let nested = [
        &COMPONENT[..],
        &section(0x04, &inner),
        // Component instance section: two instances of component 0.
        &section(0x05, &[0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]),
    ]
    .concat();
    vec![
        ("empty", COMPONENT.to_vec()),
        ("module-instance", inner),
        ("nested-twice", nested),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_components_have_the_footprint_they_were_made_with() {
        let all = components();
        let footprint = |name: &str| {
            let (_, bytes) = all.iter().find(|(n, _)| *n == name).expect("a seed");
            crate::footprint::footprint(bytes).expect("a well-formed component")
        };
        assert_eq!(footprint("empty").needs.core_instances, 0);
        let one = footprint("module-instance").needs;
        assert_eq!((one.core_instances, one.memories), (1, 1));
        assert_eq!(one.initial_memory, 64 * 1024);
        let two = footprint("nested-twice").needs;
        assert_eq!((two.core_instances, two.memories), (2, 2));
    }
}
