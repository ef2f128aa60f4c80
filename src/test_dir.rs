//! A fresh directory for a test's database files, removed when dropped.

pub struct Dir(std::path::PathBuf);

impl Dir {
    pub fn new() -> Dir {
        let p = std::env::temp_dir().join(format!("composeai-test-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }

    /// The path of `name` in the directory.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    /// The path of the store's database file, `runs.db`.
    pub fn db(&self) -> String {
        self.path("runs.db")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
