package dispatch

import "testing"

// A refresh that changed nodes is followed soon by the next (the hint is moving); one that
// changed none waits the idle interval.
func TestCapacityWait(t *testing.T) {
	if got := capacityWait(3); got != capacityBusy {
		t.Errorf("after a refresh that changed 3 nodes: %v, want %v", got, capacityBusy)
	}
	if got := capacityWait(0); got != capacityIdle {
		t.Errorf("after a refresh that changed nothing: %v, want %v", got, capacityIdle)
	}
	if capacityBusy >= capacityIdle {
		t.Errorf("busy interval %v is not shorter than the idle one %v", capacityBusy, capacityIdle)
	}
}
