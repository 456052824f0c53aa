"""roboloop's own tasks, one module each (each registers itself with roboloop.sim.registry on import; none imports
a simulator). `docs/guides/add-a-task.md` walks through adding one."""
