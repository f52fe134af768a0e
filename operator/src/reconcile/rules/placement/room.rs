//! A node's room left during a placement run, and what one replica needs of it (cpus in
//! thousandths, memory in MB; `None` where the node or the agent does not count it).

#[derive(Clone, Copy)]
pub struct Room {
    pub slots: u32,
    pub cpus: Option<u64>,
    pub mem: Option<u64>,
}

impl Room {
    pub fn fits(&self, d: &Need) -> bool {
        self.slots > 0
            && match (self.cpus, d.cpus) {
                (Some(have), Some(need)) => have >= need,
                _ => true,
            }
            && match (self.mem, d.mem) {
                (Some(have), Some(need)) => have >= need,
                _ => true,
            }
    }

    pub fn take(&mut self, d: &Need) {
        self.slots -= 1;
        if let (Some(h), Some(n)) = (self.cpus.as_mut(), d.cpus) {
            *h -= n;
        }
        if let (Some(h), Some(n)) = (self.mem.as_mut(), d.mem) {
            *h -= n;
        }
    }

    /// The room a replica leaving gives back.
    pub fn give(&mut self, d: &Need) {
        self.slots += 1;
        if let (Some(h), Some(n)) = (self.cpus.as_mut(), d.cpus) {
            *h += n;
        }
        if let (Some(h), Some(n)) = (self.mem.as_mut(), d.mem) {
            *h += n;
        }
    }
}

#[derive(Clone, Copy, Default)]
pub struct Need {
    pub cpus: Option<u64>,
    pub mem: Option<u64>,
}
