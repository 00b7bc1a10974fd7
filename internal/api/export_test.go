package api

// DeterministicMAC lets tests take the MAC approval would give a slot first.
var DeterministicMAC = deterministicMAC
