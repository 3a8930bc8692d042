//! A component's footprint: what one instance of it takes from the
//! engine's pool, and the interfaces it imports, read from its bytes
//! with wasmparser alone (no wasmtime), before anything is compiled.
//!
//! This is the first thing the host does with a component it is given
//! (`monarch-host run`, `POST /v1/components`), so it reads hostile bytes.
//! It depends on nothing but `wasmparser` so that the fuzz target
//! `component` (fuzz/, docs/fuzzing.md) can build it on its own.
//!
//! - FP-1: malformed bytes are an error, never a panic.
//! - FP-2: counts saturate at `u32::MAX`, never wrap: a component that
//!   nests instantiations past the count (a few hundred bytes suffice)
//!   cannot make itself look small to the pool's checks.

/// What one instance of a component takes from the engine's pool, and
/// what it imports: read from its bytes, without compiling it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    /// What one instance of it allocates.
    pub needs: Needs,
    /// The names of the instances (interfaces) it imports, such as
    /// `wasi:cli/stdout@0.2.0`.
    pub interfaces: Vec<String>,
}

/// What an instance of a module or component allocates from the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Core module instances.
    pub core_instances: u32,
    /// Linear memories defined (imported ones are someone else's).
    pub memories: u32,
    /// Tables defined.
    pub tables: u32,
    /// The largest initial size of one of its memories, in bytes.
    pub initial_memory: u64,
    /// The largest initial size of one of its tables, in elements.
    pub initial_table: u64,
}

impl Needs {
    fn add(&mut self, other: &Needs) {
        self.core_instances = self.core_instances.saturating_add(other.core_instances);
        self.memories = self.memories.saturating_add(other.memories);
        self.tables = self.tables.saturating_add(other.tables);
        self.initial_memory = self.initial_memory.max(other.initial_memory);
        self.initial_table = self.initial_table.max(other.initial_table);
    }
}

/// A module or component being read: what its instance needs, and for a
/// component, what each module and component of its index spaces needs.
#[derive(Default)]
struct Scope {
    component: bool,
    needs: Needs,
    modules: Vec<Needs>,
    components: Vec<Needs>,
}

/// Reads what an instance of the component `bytes` allocates (every module
/// it instantiates, nested components included) and the interfaces it
/// imports. Cheap next to compiling: one pass over the sections, no
/// validation (the compiler validates).
pub fn footprint(bytes: &[u8]) -> Result<Footprint, String> {
    use wasmparser::{
        ComponentAlias, ComponentInstance, ComponentOuterAliasKind, ComponentTypeRef, Encoding,
        Instance, Parser, Payload,
    };
    let bad = |e: wasmparser::BinaryReaderError| format!("malformed component: {e}");
    let mut footprint = Footprint::default();
    // The module or component being read, innermost last.
    let mut scopes: Vec<Scope> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(bad)? {
            Payload::Version { encoding, .. } => scopes.push(Scope {
                component: encoding == Encoding::Component,
                ..Scope::default()
            }),
            Payload::MemorySection(memories) => {
                let scope = scopes.last_mut().ok_or("a section outside any module")?;
                for memory in memories {
                    let memory = memory.map_err(bad)?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                    scope.needs.memories = scope.needs.memories.saturating_add(1);
                    scope.needs.initial_memory = scope
                        .needs
                        .initial_memory
                        .max(memory.initial.saturating_mul(page));
                }
            }
            Payload::TableSection(tables) => {
                let scope = scopes.last_mut().ok_or("a section outside any module")?;
                for table in tables {
                    let table = table.map_err(bad)?;
                    scope.needs.tables = scope.needs.tables.saturating_add(1);
                    scope.needs.initial_table = scope.needs.initial_table.max(table.ty.initial);
                }
            }
            Payload::InstanceSection(instances) => {
                let scope = scopes.last_mut().ok_or("a section outside any component")?;
                for instance in instances {
                    if let Instance::Instantiate { module_index, .. } = instance.map_err(bad)? {
                        let module = scope.modules.get(module_index as usize).copied();
                        scope.needs.add(&module.unwrap_or_default());
                        scope.needs.core_instances = scope.needs.core_instances.saturating_add(1);
                    }
                }
            }
            Payload::ComponentInstanceSection(instances) => {
                let scope = scopes.last_mut().ok_or("a section outside any component")?;
                for instance in instances {
                    if let ComponentInstance::Instantiate {
                        component_index, ..
                    } = instance.map_err(bad)?
                    {
                        let component = scope.components.get(component_index as usize).copied();
                        scope.needs.add(&component.unwrap_or_default());
                    }
                }
            }
            // Aliases, imports and exports of modules and components add to
            // their index spaces.
            Payload::ComponentAliasSection(aliases) => {
                for alias in aliases {
                    let (sort, needs) = match alias.map_err(bad)? {
                        ComponentAlias::Outer { kind, count, index } => {
                            let sort = match kind {
                                ComponentOuterAliasKind::CoreModule => Sort::Module,
                                ComponentOuterAliasKind::Component => Sort::Component,
                                _ => continue,
                            };
                            let at = scopes.len().checked_sub(1 + count as usize);
                            (sort, at.and_then(|at| scopes[at].get(sort, index)))
                        }
                        ComponentAlias::InstanceExport { kind, .. } => match Sort::of(kind) {
                            Some(sort) => (sort, None),
                            None => continue,
                        },
                        ComponentAlias::CoreInstanceExport { .. } => continue,
                    };
                    push(&mut scopes, sort, needs);
                }
            }
            Payload::ComponentImportSection(imports) => {
                let top = scopes.len() == 1;
                for import in imports {
                    let import = import.map_err(bad)?;
                    match import.ty {
                        ComponentTypeRef::Module(_) => push(&mut scopes, Sort::Module, None),
                        ComponentTypeRef::Component(_) => push(&mut scopes, Sort::Component, None),
                        ComponentTypeRef::Instance(_) if top => {
                            footprint.interfaces.push(import.name.name.to_string())
                        }
                        _ => {}
                    }
                }
            }
            Payload::ComponentExportSection(exports) => {
                for export in exports {
                    let export = export.map_err(bad)?;
                    if let Some(sort) = Sort::of(export.kind) {
                        let needs = scopes.last().and_then(|s| s.get(sort, export.index));
                        push(&mut scopes, sort, needs);
                    }
                }
            }
            Payload::End(_) => {
                let ended = scopes.pop().ok_or("an end outside any module")?;
                let Some(parent) = scopes.last_mut() else {
                    footprint.needs = ended.needs;
                    break;
                };
                // A nested module is listed by what one instance of it
                // needs; a nested component by what all it instantiates.
                match ended.component {
                    true => parent.components.push(ended.needs),
                    false => parent.modules.push(ended.needs),
                }
            }
            _ => {}
        }
    }
    Ok(footprint)
}

/// The index spaces of a component that hold what instantiating needs.
#[derive(Clone, Copy)]
enum Sort {
    Module,
    Component,
}

impl Sort {
    fn of(kind: wasmparser::ComponentExternalKind) -> Option<Sort> {
        match kind {
            wasmparser::ComponentExternalKind::Module => Some(Sort::Module),
            wasmparser::ComponentExternalKind::Component => Some(Sort::Component),
            _ => None,
        }
    }
}

impl Scope {
    fn list(&mut self, sort: Sort) -> &mut Vec<Needs> {
        match sort {
            Sort::Module => &mut self.modules,
            Sort::Component => &mut self.components,
        }
    }

    fn get(&self, sort: Sort, index: u32) -> Option<Needs> {
        let list = match sort {
            Sort::Module => &self.modules,
            Sort::Component => &self.components,
        };
        list.get(index as usize).copied()
    }
}

/// Adds to the innermost scope's `sort` what an instance of it needs
/// (nothing known: an import, or an export of an instance).
fn push(scopes: &mut [Scope], sort: Sort, needs: Option<Needs>) {
    if let Some(scope) = scopes.last_mut() {
        scope.list(sort).push(needs.unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn section(id: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![id];
        leb128(contents.len(), &mut out);
        out.extend_from_slice(contents);
        out
    }

    const COMPONENT: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    /// A module with one memory of one page, and the sections that add it
    /// to a component and instantiate it once.
    fn module_instance() -> Vec<u8> {
        let module = [
            &[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00][..],
            &section(0x05, &[0x01, 0x00, 0x01]),
        ]
        .concat();
        [
            section(0x01, &module),
            section(0x02, &[0x01, 0x00, 0x00, 0x00]),
        ]
        .concat()
    }

    #[test]
    fn fp2_nested_instantiations_saturate_instead_of_wrapping() {
        // Each level instantiates the one inside it twice: 2^33 core
        // instances at the top, which then instantiates one more module.
        let mut level = [&COMPONENT[..], &module_instance()].concat();
        for _ in 0..33 {
            let twice = [0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00];
            level = [
                &COMPONENT[..],
                &section(0x04, &level),
                &section(0x05, &twice),
            ]
            .concat();
        }
        level.extend_from_slice(&module_instance());
        let needs = footprint(&level).expect("a well-formed component").needs;
        assert_eq!(needs.core_instances, u32::MAX);
        assert_eq!(needs.memories, u32::MAX);
        assert_eq!(needs.initial_memory, 64 * 1024);
    }

    #[test]
    fn fp1_cut_and_garbled_components_are_answered_without_a_panic() {
        let whole = [&COMPONENT[..], &module_instance()].concat();
        assert!(footprint(&whole).is_ok());
        // Cut anywhere: an error or what the sections before the cut hold
        // (the compiler refuses the rest), never a panic.
        for cut in 0..whole.len() {
            let _ = footprint(&whole[..cut]);
        }
        assert!(footprint(&[0xff; 16]).is_err());
        assert!(footprint(&[&COMPONENT[..], &[0x01, 0x7f]].concat()).is_err());
    }
}
