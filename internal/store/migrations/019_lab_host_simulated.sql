-- A lab host (gpuaas-hostd enrolled with --lab-host: display controllers and NVMe controllers
-- stand in for GPUs and the fabric NIC) is simulated like a sim host: any write of agent facts
-- that says lab_host marks the node, and the same stickiness applies (migration 016).
DROP TRIGGER nodes_mark_simulated ON nodes;
CREATE TRIGGER nodes_mark_simulated BEFORE UPDATE OF agent_facts ON nodes
    FOR EACH ROW WHEN ((NEW.agent_facts->>'runtime' = 'sim' OR NEW.agent_facts->>'lab_host' = 'true') AND NOT NEW.simulated)
    EXECUTE FUNCTION nodes_mark_simulated();

---- create above / drop below ----

DROP TRIGGER nodes_mark_simulated ON nodes;
CREATE TRIGGER nodes_mark_simulated BEFORE UPDATE OF agent_facts ON nodes
    FOR EACH ROW WHEN (NEW.agent_facts->>'runtime' = 'sim' AND NOT NEW.simulated)
    EXECUTE FUNCTION nodes_mark_simulated();
