set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/rho-gain.png'
set title 'rho-gain'
set xlabel 'rho (fit quality)'
set ylabel 'net TPOT gain (%)'
$d0 << EOD
0.717031 -5.30028
0.66282 -5.20725
0.657372 -4.89744
0.642444 -5.31745
0.682063 -5.14724
0.64063 -4.90186
0.579311 -4.76515
0.543014 -4.23159
EOD
plot $d0 using 1:2 with points pt 7 title 'net_pct'
